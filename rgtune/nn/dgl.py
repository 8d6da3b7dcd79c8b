"""DGL's conv modules on rgtune's generated kernels: change ``from dgl.nn import RelGraphConv`` (or ``HGTConv``,
or ``HeteroGraphConv, GATConv`` for a GAT per relation) to ``from rgtune.nn.dgl import ...`` and the script runs
as it did, faster. :class:`HGTConv` and :class:`HeteroGraphConv` are described in their own docstrings; the
rest of this one is :class:`RelGraphConv`'s.

:class:`RelGraphConv` takes DGL's constructor arguments and call (``conv(g, feat, etypes, norm=None)``), and
its parameters are DGL's own (made by DGL's constructor: ``linear_r.W``, ``linear_r.coeff`` with the basis
regularizer, ``h_bias``, ``loop_weight``; DGL's names, shapes and initialization), so state dicts load both
ways. rgtune's RGCN weights are views of them (the block-diagonal ``bdd`` weight reshaped), so gradients
are DGL's parameters'. Edge types are the caller's integers (relation ``r`` is ``etypes == r``). A block (``dgl.to_block``, a
sampler's) runs as a mini-batch: ``feat`` holds the source nodes' rows, and only the destinations' rows are
computed (:class:`~rgtune.data.batch.Batch`).

DGL sums the messages, each multiplied by ``norm`` when given: without ``norm`` the layer runs rgtune's RGCN
with ``aggr="sum"``; with the usual right normalization, ``norm = 1 / |N_r(i)|`` (each edge's destination's
in-edges of its relation), the mean per relation. Any other ``norm`` is an error that says so: the
kernels compute those two.

Example (needs DGL):
    >>> import dgl, torch, warnings
    >>> g = dgl.graph((torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 0])))
    >>> conv = RelGraphConv(8, 4, num_rels=2, db=None)
    >>> sorted(conv.state_dict())
    ['h_bias', 'linear_r.W', 'loop_weight']
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")   # no database: the default schedule, said once
    ...     out = conv(g, torch.randn(4, 8), torch.tensor([0, 1, 1, 0]))
    >>> out.shape
    torch.Size([4, 4])
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from rgtune.data.batch import Batch
from rgtune.data.graph import HeteroGraph
from rgtune.data.interop import (batch_from_dgl, batch_from_homogeneous, check_dgl_block, from_dgl, from_pyg_homogeneous,
                                 from_typed_homogeneous)
from rgtune.nn._dropin import DropIn

__all__ = ["RelGraphConv", "HGTConv", "HeteroGraphConv", "GATConv"]
#: how far a given ``norm`` may be from the mean per relation's ``1 / |N_r(i)|`` (float32 rounding)
_NORM_TOLERANCE = 1e-5


class RelGraphConv(DropIn):
    r"""DGL's ``RelGraphConv``: :math:`h'_i = \sum_r \sum_{j \in N_r(i)} e_{ji} W_r h_j + W_0 h_i + b`, then
    ``activation`` and ``dropout``; :math:`e_{ji}` is ``norm`` (1 without it). See the module docstring.

    Args (DGL's): in_feat, out_feat, num_rels, regularizer (``None``, ``"basis"``, ``"bdd"``), num_bases,
        bias, activation, self_loop, dropout, layer_norm. ``bias`` and ``self_loop`` must be True and
        ``layer_norm`` False (rgtune's RGCN has the root weight and the bias, no layer norm).
    Keyword-only (rgtune's): backend, db, mode, as :class:`rgtune.nn.pyg.RGCNConv`.
    """

    model = "rgcn"

    def __init__(self, in_feat: int, out_feat: int, num_rels: int, regularizer: str | None = None,
                 num_bases: int | None = None, bias: bool = True, activation: Callable[[Tensor], Tensor] | None = None,
                 self_loop: bool = True, dropout: float = 0.0, layer_norm: bool = False, *, backend: str = "auto",
                 db: Any = "results.db", mode: str = "training") -> None:
        super().__init__()
        name = type(self).__name__
        for flag, value, want in (("bias", bias, True), ("self_loop", self_loop, True), ("layer_norm", layer_norm, False)):
            if value != want:
                raise ValueError(f"{name}: {flag}={value} is not supported; rgtune's RGCN has the self-loop weight and "
                                 f"the bias, and no layer norm ({flag}={want})")
        from dgl.nn.pytorch import RelGraphConv as DGLRelGraphConv  # DGL's parameters, by DGL's own constructor

        dgl_conv = DGLRelGraphConv(in_feat, out_feat, num_rels, regularizer, num_bases, bias=True,
                                   self_loop=True, dropout=dropout)
        self.linear_r = dgl_conv.linear_r
        self.h_bias, self.loop_weight = dgl_conv.h_bias, dgl_conv.loop_weight
        self.dropout = dgl_conv.dropout
        self.activation = activation
        self.in_feat, self.out_feat, self.num_rels = in_feat, out_feat, num_rels
        self.regularizer = regularizer
        self.num_bases = dgl_conv.linear_r.num_bases if regularizer is not None else None
        # a layer per aggregation (a sum without norm, the mean with 1/|N_r(i)|)
        self._setup(in_feat, out_feat, 1, self._options("mean"), backend, db, mode)

    def _options(self, aggr: str) -> dict[str, Any]:
        opts: dict[str, Any] = {"aggr": aggr} if aggr != "mean" else {}
        if self.regularizer == "basis":
            opts["num_bases"] = self.num_bases
        elif self.regularizer == "bdd":
            opts["num_blocks"] = self.num_bases
        return opts

    def forward(self, g: Any, feat: Tensor, etypes: Tensor | list[int], norm: Tensor | None = None, *,
                presorted: bool = False) -> Tensor:
        name = type(self).__name__
        if not isinstance(etypes, Tensor):  # DGL's presorted form: the number of edges of each type
            etypes = torch.repeat_interleave(torch.arange(len(etypes)), torch.as_tensor(etypes))
        graph, mean_norm = self._graph(g, etypes)
        aggr = "sum"
        if norm is not None:
            checked = (id(norm), norm._version)  # the same tensor every epoch: checked once per graph
            if graph.__dict__.get("_rgtune_dgl_norm_checked") != checked:
                given = norm.detach().reshape(-1).to("cpu", torch.float64)
                if given.numel() != mean_norm.numel() or not torch.allclose(given, mean_norm, rtol=_NORM_TOLERANCE,
                                                                             atol=0.0):
                    raise ValueError(f"{name}: norm must be None (a sum) or 1 / |N_r(i)| per edge (the mean over each "
                                     "relation's in-edges of the destination, DGL's right normalization per relation): "
                                     "rgtune's RGCN computes those two")
                graph.__dict__["_rgtune_dgl_norm_checked"] = checked
            aggr = "mean"
        h = self._run(graph, feat, feat.device, self._options(aggr))
        if self.activation is not None:
            h = self.activation(h)
        return self.dropout(h)

    def _rgtune_params(self, graph: HeteroGraph) -> dict[str, Tensor]:
        """rgtune's RGCN weights are DGL's parameters (``bdd``'s flat blocks viewed as ``(R, B, in/B, out/B)``)."""
        weight = self.linear_r.W
        if self.regularizer == "bdd":
            b = self.num_bases
            weight = weight.view(self.num_rels, b, self.in_feat // b, self.out_feat // b)
        params = {"weight": weight, "root": self.loop_weight, "bias": self.h_bias}
        if self.regularizer == "basis":
            params["comp"] = self.linear_r.coeff
        return params

    def _graph(self, g: Any, etypes: Tensor) -> tuple[HeteroGraph | Batch, Tensor]:
        """What the kernels run on for ``g`` and ``etypes`` (a graph, or a block's :class:`Batch`; kept while the
        same objects come back) and each edge's ``1 / |N_r(i)|``, in DGL's edge order."""
        key = (id(g), id(etypes), etypes._version, g.num_src_nodes(), g.num_dst_nodes(), g.num_edges())
        graph = self._kept(key, (g, etypes), lambda: self._build(g, etypes))
        return graph, graph.__dict__["_rgtune_dgl_mean_norm"]

    def _build(self, g: Any, etypes: Tensor) -> HeteroGraph | Batch:
        """A graph's :class:`HeteroGraph`, or a block's :class:`Batch` (its destinations are the first source
        nodes, as ``dgl.to_block`` makes them: only their rows are computed), with DGL's mean norm per edge."""
        src, dst = (e.to("cpu", torch.int64) for e in g.edges())
        num_src, num_dst = g.num_src_nodes(), g.num_dst_nodes()
        et = etypes.to("cpu", torch.int64).reshape(-1)
        built: HeteroGraph | Batch
        if getattr(g, "is_block", False):
            check_dgl_block(g)
            built = batch_from_homogeneous(src, dst, et, num_src, num_dst, self.num_rels, name="dgl block")
        else:
            built = from_pyg_homogeneous(torch.stack([src, dst]), et, num_src, self.num_rels, name="dgl")
        key = et * num_dst + dst
        counts = torch.bincount(key, minlength=self.num_rels * num_dst)
        built.__dict__["_rgtune_dgl_mean_norm"] = 1.0 / counts[key].double()  # what DGL's right normalization gives
        return built

    def extra_repr(self) -> str:
        reg = f", regularizer={self.regularizer!r}, num_bases={self.num_bases}" if self.regularizer else ""
        return f"{self.in_feat}, {self.out_feat}, num_rels={self.num_rels}{reg}"


class HGTConv(DropIn):
    r"""DGL's ``HGTConv`` (the Heterogeneous Graph Transformer on DGL's typed homogeneous form): per head,
    :math:`s = \langle K_{\tau(j)} h_j W^{att}_{e}, Q_{\tau(i)} h_i \rangle \mu_e / \sqrt{d}`, softmax over
    each destination's in-edges, messages :math:`V_{\tau(j)} h_j W^{msg}_e`; then
    :math:`h'_i = \sigma(s_{\tau(i)})\,\mathrm{drop}(\tilde h_i A_{\tau(i)}) + (1 - \sigma(s_{\tau(i)}))\,x_i`
    (:math:`x_i W_{res}` when the sizes differ), and DGL's layer norm with ``use_norm``.

    Args (DGL's): in_size, head_size, num_heads, num_ntypes, num_etypes, dropout, use_norm. Its parameters are
    DGL's own, made by DGL's constructor (``linear_k/q/v/a.W``, ``relation_pri``, ``relation_att``,
    ``relation_msg``, ``skip``, ``residual_w``, ``norm``). Keyword-only (rgtune's): backend, db, mode, as
    :class:`RelGraphConv`.

    Call: ``conv(g, x, ntype, etype)`` with a graph or a block (``x`` the source nodes' rows; the destinations'
    rows are computed and returned). The kernels run rgtune's HGT with ``bias=False, activation="none",
    skip="none"`` (:func:`rgtune.ir.models.hgt`): the gate, the dropout before it and the norm are torch's.
    A relation is a (source type, edge type, destination type) triple, fixed by the first graph: a later
    graph may lack one, not add one.
    """

    model = "hgt"

    def __init__(self, in_size: int, head_size: int, num_heads: int, num_ntypes: int, num_etypes: int,
                 dropout: float = 0.2, use_norm: bool = False, *, backend: str = "auto", db: Any = "results.db",
                 mode: str = "training") -> None:
        super().__init__()
        from dgl.nn.pytorch import HGTConv as DGLHGTConv  # DGL's parameters, by DGL's own constructor

        dgl_conv = DGLHGTConv(in_size, head_size, num_heads, num_ntypes, num_etypes, dropout=dropout, use_norm=use_norm)
        for child, module in dgl_conv.named_children():
            self.add_module(child, module)
        self.skip = dgl_conv.skip
        self.residual_w = dgl_conv.residual_w if in_size != head_size * num_heads else None
        self.in_size, self.head_size, self.num_heads = in_size, head_size, num_heads
        self.num_ntypes, self.num_etypes, self.use_norm = num_ntypes, num_etypes, use_norm
        self._relations: list[tuple[int, int, int]] | None = None  # fixed by the first graph
        self._setup(in_size, head_size * num_heads, num_heads,
                    {"bias": False, "activation": "none", "skip": "none"}, backend, db, mode)

    def forward(self, g: Any, x: Tensor, ntype: Tensor, etype: Tensor, *, presorted: bool = False) -> Tensor:
        graph, src_nodes, dst_nodes = self._graph(g, ntype, etype)
        xs = {t: x[p.to(x.device)] for t, p in zip(graph.ntypes, src_nodes)}
        out = self._run(graph, xs, x.device)
        positions = torch.cat(dst_nodes).to(x.device)
        h = torch.cat([out[t] for t in graph.ntypes])[torch.argsort(positions)]  # the caller's order of destinations
        num_dst = h.size(0)
        dst_type = ntype[:num_dst].to(x.device, torch.int64)
        x_dst = x[:num_dst]
        alpha = torch.sigmoid(self.skip[dst_type]).unsqueeze(-1)
        h = self.drop(h) * alpha + (x_dst @ self.residual_w if self.residual_w is not None else x_dst) * (1 - alpha)
        return self.norm(h) if self.use_norm else h

    def _graph(self, g: Any, ntype: Tensor, etype: Tensor) -> tuple[HeteroGraph | Batch, list[Tensor], list[Tensor]]:
        key = (id(g), id(ntype), ntype._version, id(etype), etype._version, g.num_src_nodes(), g.num_dst_nodes(),
               g.num_edges())

        def build() -> Any:
            src, dst = g.edges()
            block = bool(getattr(g, "is_block", False))
            if block:
                check_dgl_block(g)
            built, src_nodes, dst_nodes = from_typed_homogeneous(
                src, dst, ntype, etype, self.num_ntypes, self.num_etypes, self._relations,
                num_dst=g.num_dst_nodes() if block else None, name="dgl block" if block else "dgl")
            if self._relations is None:
                self._relations = [(int(c[0]), int(c[1]), int(c[2])) for c in built.canonical_etypes]
            built.__dict__["_rgtune_dgl_nodes"] = (src_nodes, dst_nodes)
            return built

        built = self._kept(key, (g, ntype, etype), build)
        return built, *built.__dict__["_rgtune_dgl_nodes"]

    def _rgtune_params(self, graph: HeteroGraph | Batch) -> dict[str, Tensor]:
        """rgtune's HGT weights from DGL's parameters: node types by their number, each relation's weights
        from its edge type's (a relation is a (source, edge, destination) type triple)."""
        types = torch.tensor([int(t) for t in graph.ntypes], device=self.skip.device)
        rel = torch.tensor([int(c[1]) for c in graph.canonical_etypes], device=self.skip.device)
        per_head = lambda mods: torch.stack([m.W for m in mods], dim=1)  # noqa: E731  (E, H, D, D)
        return {"k_weight": self.linear_k.W[types], "q_weight": self.linear_q.W[types],
                "v_weight": self.linear_v.W[types], "a_weight": self.linear_a.W[types],
                "w_att": per_head(self.relation_att)[rel], "w_msg": per_head(self.relation_msg)[rel],
                "mu": torch.stack(list(self.relation_pri), dim=1)[rel]}

    def extra_repr(self) -> str:
        return (f"{self.in_size}, head_size={self.head_size}, num_heads={self.num_heads}, "
                f"num_ntypes={self.num_ntypes}, num_etypes={self.num_etypes}")


class GATConv(torch.nn.Module):
    """DGL's ``GATConv`` as a relation's module of :class:`HeteroGraphConv`: DGL's constructor and parameters
    (``fc.weight``, ``attn_l``, ``attn_r``, ``bias``; made by DGL's own constructor, so state dicts load both
    ways). It does not run alone: :class:`HeteroGraphConv` runs every relation's GAT as one RGAT program.
    What rgtune's RGAT does not compute is an error when made: ``feat_drop``, ``attn_drop`` (dropout inside
    the kernels), ``negative_slope`` other than 0.2, ``residual``, and ``activation`` (HeteroGraphConv would
    sum the relations' activated outputs; apply it to the sum)."""

    def __init__(self, in_feats: int, out_feats: int, num_heads: int, feat_drop: float = 0.0, attn_drop: float = 0.0,
                 negative_slope: float = 0.2, residual: bool = False, activation: Callable[[Tensor], Tensor] | None = None,
                 allow_zero_in_degree: bool = False, bias: bool = True) -> None:
        super().__init__()
        name = type(self).__name__
        if not isinstance(in_feats, int) or isinstance(in_feats, bool):
            raise ValueError(f"{name}: in_feats={in_feats!r}: one input size (an int); separate source and "
                             "destination sizes are not supported")
        for what, value, want in (("feat_drop", feat_drop, 0.0), ("attn_drop", attn_drop, 0.0),
                                  ("negative_slope", negative_slope, 0.2), ("residual", residual, False),
                                  ("activation", activation, None)):
            if value != want:
                raise ValueError(f"{name}: {what}={value!r} is not supported; rgtune's RGAT computes {what}={want!r}"
                                 + (" (apply the activation to HeteroGraphConv's sum)" if what == "activation" else ""))
        from dgl.nn.pytorch import GATConv as DGLGATConv  # DGL's parameters, by DGL's own constructor

        dgl_conv = DGLGATConv(in_feats, out_feats, num_heads, allow_zero_in_degree=allow_zero_in_degree, bias=bias)
        for child, module in dgl_conv.named_children():
            self.add_module(child, module)
        for pname, param in dgl_conv.named_parameters(recurse=False):
            self.register_parameter(pname, param)
        self.in_feats, self.out_feats, self.num_heads = in_feats, out_feats, num_heads
        self.allow_zero_in_degree = allow_zero_in_degree

    def set_allow_zero_in_degree(self, value: bool) -> None:
        self.allow_zero_in_degree = value

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        raise RuntimeError("rgtune.nn.dgl.GATConv runs inside rgtune.nn.dgl.HeteroGraphConv (every relation's GAT "
                           "as one kernel program); on its own, use dgl.nn.GATConv")

    def extra_repr(self) -> str:
        return f"{self.in_feats}, {self.out_feats}, num_heads={self.num_heads}"


class HeteroGraphConv(DropIn):
    r"""DGL's ``HeteroGraphConv`` of one :class:`GATConv` per relation, summed: per relation ``r`` and head,
    :math:`e_{ij} = \mathrm{LeakyReLU}(a_l \cdot W_r h_j + a_r \cdot W_r h_i)`, softmax over ``i``'s in-edges of
    ``r``, :math:`h'_i = \sum_r (\sum_{j \in N_r(i)} \alpha_{ij} W_r h_j + b_r)`. The kernels run rgtune's
    RGAT with ``softmax="relation"`` over every relation at once; the biases are added after them. On a block
    (``dgl.to_block``, a sampler's) only the destinations' rows are computed.

    Args (DGL's): mods (edge type or canonical edge type -> :class:`GATConv`, all of one size and heads),
    aggregate (``"sum"``). Keyword-only (rgtune's): backend, db, mode, as :class:`RelGraphConv`. Call:
    ``conv(g, {ntype: features})`` on a DGL heterograph or block (the source nodes' features, or DGL's
    ``(source, destination)`` pair) -> ``{ntype: (n, heads, out)}`` for the node types that relations reach,
    as DGL's. Relations are matched to modules by name, as DGL matches them.
    """

    model = "rgat"

    def __init__(self, mods: dict[Any, GATConv], aggregate: str = "sum", *, backend: str = "auto",
                 db: Any = "results.db", mode: str = "training") -> None:
        super().__init__()
        name = type(self).__name__
        if aggregate != "sum":
            raise ValueError(f"{name}: aggregate={aggregate!r} is not supported; rgtune's RGAT sums the relations "
                             "(aggregate='sum')")
        for key, mod in mods.items():
            if not isinstance(mod, GATConv):
                raise TypeError(f"{name}: the module of {key!r} is a {type(mod).__name__}; rgtune runs "
                                "rgtune.nn.dgl.GATConv modules (DGL's GATConv by rgtune's import)")
        sizes = {(m.in_feats, m.out_feats, m.num_heads) for m in mods.values()}
        if len(sizes) != 1:
            raise ValueError(f"{name}: the GATConv modules differ in (in_feats, out_feats, num_heads): {sorted(sizes)}; "
                             "rgtune's RGAT has one size for every relation")
        (in_feats, out_feats, heads), = sizes
        self.mod_dict = dict(mods)
        self.mods = torch.nn.ModuleDict({str(k): v for k, v in mods.items()})
        for mod in self.mods.values():
            mod.set_allow_zero_in_degree(True)  # as DGL's HeteroGraphConv does
        self.out_feats, self.num_heads = out_feats, heads
        self._setup(in_feats, heads * out_feats, heads, {"softmax": "relation"}, backend, db, mode)

    def _mod(self, cet: tuple[str, str, str]) -> GATConv:
        """The module of a relation: by its canonical edge type, else by its edge type (DGL's lookup)."""
        mod = self.mod_dict.get(cet, self.mod_dict.get(cet[1]))
        if mod is None:
            raise KeyError(f"{type(self).__name__}: no module for edge type {cet}; mods has {list(self.mod_dict)}")
        return mod

    def forward(self, g: Any, inputs: dict[str, Tensor], mod_args: Any = None, mod_kwargs: Any = None) -> dict[str, Tensor]:
        name = type(self).__name__
        if mod_args or mod_kwargs:
            raise ValueError(f"{name}: mod_args and mod_kwargs are not supported (the GATConv modules take none)")
        block = bool(getattr(g, "is_block", False))
        if isinstance(inputs, tuple):  # DGL's (source, destination) form: the destinations are the sources' first rows
            inputs = inputs[0]
        graph: HeteroGraph | Batch = self._kept((id(g), g.num_edges()), (g,), lambda: batch_from_dgl(g) if block
                                                else from_dgl(g, name="dgl"))
        sizes = graph.num_src if isinstance(graph, Batch) else {t: graph.num_nodes(t) for t in graph.ntypes}
        missing = [t for t in graph.ntypes if t not in inputs and sizes[t]]
        if missing:
            raise ValueError(f"{name}: inputs lack node types {missing}; rgtune's RGAT reads every type's features")
        x = {t: inputs[t] for t in graph.ntypes if t in inputs}
        out = self._run(graph, x, next(iter(inputs.values())).device)
        result = {}
        for t in dict.fromkeys(c[2] for c in graph.canonical_etypes):  # the types that relations reach
            biases = [m.bias for c in graph.canonical_etypes if c[2] == t if (m := self._mod(c)).bias is not None]
            h = out[t] + sum(biases) if biases else out[t]  # each relation's GATConv adds its bias
            result[t] = h.view(h.size(0), self.num_heads, self.out_feats)
        return result

    def _rgtune_params(self, graph: HeteroGraph | Batch) -> dict[str, Tensor]:
        """Per relation its module's ``fc.weight`` (transposed), ``attn_l`` (the source's attention vector)
        and ``attn_r`` (the destination's), per head."""
        mods = [self._mod(c) for c in graph.canonical_etypes]
        heads, d = self.num_heads, self.out_feats
        return {"weight": torch.stack([m.fc.weight.T for m in mods]),
                "attn_src": torch.stack([m.attn_l.view(heads, d) for m in mods]),
                "attn_dst": torch.stack([m.attn_r.view(heads, d) for m in mods])}
