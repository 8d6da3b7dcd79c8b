"""DGL's conv modules on rgtune's generated kernels: change ``from dgl.nn import RelGraphConv`` (or ``HGTConv``,
``GATConv``, or ``HeteroGraphConv``, DGL's container, with ``GATConv`` per relation) to
``from rgtune.nn.dgl import ...`` and the script runs as it did, faster. :class:`HGTConv` and :class:`HeteroGraphConv` are described in their own docstrings; the
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
in-edges of its relation), the mean per relation (the kernels' own degrees); any other ``(E, 1)`` norm is
rgtune RGCN's caller-supplied edge weight (``aggr="weighted"``, DGL's edge order mapped to the graph's). A
``norm`` that requires grad is an error (the kernels take it as a constant). ``presorted`` is accepted
(the kernels sort the edges by relation either way), with ``etypes`` a tensor or DGL's list of counts.

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
from rgtune.data.interop import (batch_from_homogeneous, check_dgl_block, from_dgl, from_pyg_homogeneous,
                                 from_typed_homogeneous)
from rgtune.nn._dropin import DropIn

__all__ = ["RelGraphConv", "HGTConv", "HeteroGraphConv", "GATConv"]
#: how far a given ``norm`` may be from the mean per relation's ``1 / |N_r(i)|`` (float32 rounding)
_NORM_TOLERANCE = 1e-5


class RelGraphConv(DropIn):
    r"""DGL's ``RelGraphConv``: :math:`h'_i = \sum_r \sum_{j \in N_r(i)} e_{ji} W_r h_j + W_0 h_i + b`, then
    ``activation`` and ``dropout``; :math:`e_{ji}` is ``norm`` (1 without it). See the module docstring.

    Args (DGL's): in_feat, out_feat, num_rels, regularizer (``None``, ``"basis"``, ``"bdd"``), num_bases,
        bias, activation, self_loop, dropout, layer_norm. ``self_loop=False`` and ``bias=False`` are rgtune's
        RGCN options ``root_weight=False`` and ``bias=False``; with ``layer_norm`` the kernels compute the
        messages' sum alone (both options False) and DGL's ``LayerNorm``, the bias and the self-loop term
        follow in torch, in DGL's order (as DGL computes them, after its message passing).
    Keyword-only (rgtune's): backend, db, mode, as :class:`rgtune.nn.pyg.RGCNConv`.
    """

    model = "rgcn"

    def __init__(self, in_feat: int, out_feat: int, num_rels: int, regularizer: str | None = None,
                 num_bases: int | None = None, bias: bool = True, activation: Callable[[Tensor], Tensor] | None = None,
                 self_loop: bool = True, dropout: float = 0.0, layer_norm: bool = False, *, backend: str = "auto",
                 db: Any = "results.db", mode: str = "training") -> None:
        super().__init__()
        from dgl.nn.pytorch import RelGraphConv as DGLRelGraphConv  # DGL's parameters, by DGL's own constructor

        dgl_conv = DGLRelGraphConv(in_feat, out_feat, num_rels, regularizer, num_bases, bias=bias,
                                   self_loop=self_loop, dropout=dropout, layer_norm=layer_norm)
        self.linear_r = dgl_conv.linear_r
        if bias:
            self.h_bias = dgl_conv.h_bias
        if self_loop:
            self.loop_weight = dgl_conv.loop_weight
        if layer_norm:
            self.layer_norm_weight = dgl_conv.layer_norm_weight
        self.bias, self.self_loop, self.layer_norm = bias, self_loop, layer_norm  # DGL's flags, by DGL's names
        self.dropout = dgl_conv.dropout
        self.activation = activation
        self.in_feat, self.out_feat, self.num_rels = in_feat, out_feat, num_rels
        self.regularizer = regularizer
        self.num_bases = dgl_conv.linear_r.num_bases if regularizer is not None else None
        # a layer per aggregation (a sum without norm, the mean with 1/|N_r(i)|)
        self._setup(in_feat, out_feat, 1, self._options("mean"), backend, db, mode)

    def _kernel_terms(self) -> tuple[bool, bool]:
        """Whether the kernels add the self-loop term and the bias (with ``layer_norm`` DGL normalizes the
        messages' sum alone: both are added after the norm, as DGL adds them)."""
        return self.self_loop and not self.layer_norm, self.bias and not self.layer_norm

    def _options(self, aggr: str) -> dict[str, Any]:
        opts: dict[str, Any] = {"aggr": aggr} if aggr != "mean" else {}
        if self.regularizer == "basis":
            opts["num_bases"] = self.num_bases
        elif self.regularizer == "bdd":
            opts["num_blocks"] = self.num_bases
        root, bias = self._kernel_terms()
        if not root:
            opts["root_weight"] = False
        if not bias:
            opts["bias"] = False
        return opts

    def forward(self, g: Any, feat: Tensor, etypes: Tensor | list[int], norm: Tensor | None = None, *,
                presorted: bool = False) -> Tensor:
        name = type(self).__name__
        if not isinstance(etypes, Tensor):  # DGL's presorted form: the number of edges of each type
            etypes = torch.repeat_interleave(torch.arange(len(etypes)), torch.as_tensor(etypes))
        graph, mean_norm = self._graph(g, etypes)
        aggr, weight = "sum", None
        if norm is not None:
            if norm.numel() != mean_norm.numel():
                raise ValueError(f"{name}: norm has {norm.numel()} values for {mean_norm.numel()} edges (one per "
                                 "edge: (E,) or (E, 1), in the graph's edge order)")
            checked = (id(norm), norm._version)  # the same tensor every epoch: checked once per graph
            if graph.__dict__.get("_rgtune_dgl_norm_checked") != checked:
                given = norm.detach().reshape(-1).to("cpu", torch.float64)
                graph.__dict__["_rgtune_dgl_norm_mean"] = bool(torch.allclose(given, mean_norm, rtol=_NORM_TOLERANCE,
                                                                              atol=0.0))
                graph.__dict__["_rgtune_dgl_norm_checked"] = checked
            if graph.__dict__["_rgtune_dgl_norm_mean"] and not norm.requires_grad:
                aggr = "mean"  # DGL's right normalization per relation: the kernels' own 1 / |N_r(i)|
            else:
                if norm.requires_grad:
                    raise ValueError(f"{name}: norm requires grad; rgtune's RGCN takes the per-edge weight as a "
                                     "constant (no gradient to it): pass norm.detach()")
                aggr = "weighted"  # any per-edge norm: rgtune RGCN's caller-supplied edge weight
                order = graph.__dict__["_rgtune_dgl_edge_order"].to(norm.device)
                weight = norm.reshape(-1)[order]  # DGL's edge order -> the graph's (relation by relation)
        h = self._run(graph, feat, feat.device, self._options(aggr), edge_weight=weight)
        if self.layer_norm:  # DGL's order: the norm of the messages' sum, then the bias and the self-loop term
            h = self.layer_norm_weight(h)
            if self.bias:
                h = h + self.h_bias
            if self.self_loop:
                h = h + feat[:h.size(0)] @ self.loop_weight
        if self.activation is not None:
            h = self.activation(h)
        return self.dropout(h)

    def _rgtune_params(self, graph: HeteroGraph) -> dict[str, Tensor]:
        """rgtune's RGCN weights are DGL's parameters (``bdd``'s flat blocks viewed as ``(R, B, in/B, out/B)``)."""
        weight = self.linear_r.W
        if self.regularizer == "bdd":
            b = self.num_bases
            weight = weight.view(self.num_rels, b, self.in_feat // b, self.out_feat // b)
        params = {"weight": weight}
        root, bias = self._kernel_terms()
        if root:
            params["root"] = self.loop_weight
        if bias:  # the root linear's bias (out,), or without the root the program's own (1, out)
            params["bias"] = self.h_bias if root else self.h_bias.view(1, -1)
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
        built.__dict__["_rgtune_dgl_edge_order"] = torch.sort(et, stable=True).indices  # the graph's edges, in DGL's ids
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


def _gat_sizes(mod: "GATConv") -> tuple[int, int, int]:
    return mod.in_feats, mod.out_feats, mod.num_heads


def _is_prefix(dst: Tensor, src: Tensor) -> bool:
    """``dst`` is ``src[:len(dst)]`` by storage (DGL's own form on a block, or the same tensor twice)."""
    return dst is src or (dst.device == src.device and dst.dtype == src.dtype and dst.data_ptr() == src.data_ptr()
                          and dst.shape[1:] == src.shape[1:] and dst.stride() == src.stride()
                          and dst.size(0) <= src.size(0))


def _edges(g: Any, cet: Any) -> tuple[Tensor, Tensor]:
    s, d = g.edges(etype=cet, order="eid")
    return s.to("cpu", torch.int64), d.to("cpu", torch.int64)


class GATConv(DropIn):
    """DGL's ``GATConv`` on rgtune's generated kernels, as a relation's module of :class:`HeteroGraphConv` or
    alone: DGL's constructor and parameters (``fc.weight``, ``attn_l``, ``attn_r``, ``bias``; made by DGL's
    own constructor, so state dicts load both ways) and DGL's call, ``conv(g, feat)`` on a graph of one
    relation (a homogeneous graph, a bipartite one, a relation ``g[stype, etype, dtype]`` of a heterograph, or
    a block), ``feat`` one tensor or DGL's ``(source, destination)`` pair -> ``(num_dst, num_heads, out_feats)``.

    The kernels run rgtune's RGAT program of one relation over two node types, the sources and the
    destinations (each reads its own rows: a pair's destinations are its second tensor's, as DGL's); the bias
    is added after them. In a :class:`HeteroGraphConv` that sums (or averages) relations of these modules, the
    container runs every relation at once instead (one program).

    What rgtune's RGAT does not compute is an error when made: ``feat_drop``, ``attn_drop`` (dropout inside
    the kernels), ``negative_slope`` other than 0.2, ``residual`` and separate source and destination sizes;
    in the call, ``edge_weight`` and ``get_attention``. ``activation`` runs after the bias, as DGL's.
    Keyword-only (rgtune's): backend, db, mode, as :class:`RelGraphConv`.
    """

    model = "rgat"
    #: the one relation's program: its node types and relation
    _NTYPES = ["dst", "src"]
    _CET = ("src", "edge", "dst")

    def __init__(self, in_feats: int, out_feats: int, num_heads: int, feat_drop: float = 0.0, attn_drop: float = 0.0,
                 negative_slope: float = 0.2, residual: bool = False, activation: Callable[[Tensor], Tensor] | None = None,
                 allow_zero_in_degree: bool = False, bias: bool = True, *, backend: str = "auto",
                 db: Any = "results.db", mode: str = "training") -> None:
        super().__init__()
        name = type(self).__name__
        if not isinstance(in_feats, int) or isinstance(in_feats, bool):
            raise ValueError(f"{name}: in_feats={in_feats!r}: one input size (an int); separate source and "
                             "destination sizes are not supported")
        for what, value, want in (("feat_drop", feat_drop, 0.0), ("attn_drop", attn_drop, 0.0),
                                  ("negative_slope", negative_slope, 0.2), ("residual", residual, False)):
            if value != want:
                raise ValueError(f"{name}: {what}={value!r} is not supported; rgtune's RGAT computes {what}={want!r}")
        from dgl.nn.pytorch import GATConv as DGLGATConv  # DGL's parameters, by DGL's own constructor

        dgl_conv = DGLGATConv(in_feats, out_feats, num_heads, allow_zero_in_degree=allow_zero_in_degree, bias=bias)
        for child, module in dgl_conv.named_children():
            self.add_module(child, module)
        for pname, param in dgl_conv.named_parameters(recurse=False):
            self.register_parameter(pname, param)
        if not hasattr(self, "bias"):
            self.bias = None
        self.in_feats, self.out_feats, self.num_heads = in_feats, out_feats, num_heads
        self.allow_zero_in_degree = allow_zero_in_degree
        self.activation = activation
        self._setup(in_feats, num_heads * out_feats, num_heads, {}, backend, db, mode)

    def set_allow_zero_in_degree(self, value: bool) -> None:
        self.allow_zero_in_degree = value

    def forward(self, graph: Any, feat: Tensor | tuple[Tensor, Tensor], edge_weight: Tensor | None = None,
                get_attention: bool = False) -> Tensor:
        name = type(self).__name__
        if edge_weight is not None:
            raise ValueError(f"{name}: edge_weight is not supported (rgtune's RGAT has no per-edge weight); "
                             "call it with edge_weight=None")
        if get_attention:
            raise ValueError(f"{name}: get_attention=True is not supported (the kernels do not return the "
                             "attention); call it with get_attention=False")
        if len(graph.canonical_etypes) != 1:
            raise ValueError(f"{name}: the graph has {len(graph.canonical_etypes)} relations; a GATConv runs on "
                             "one (use HeteroGraphConv for a heterograph)")
        if not self.allow_zero_in_degree and graph.num_dst_nodes() and bool((graph.in_degrees() == 0).any()):
            from dgl import DGLError

            raise DGLError(f"{name}: there are 0-in-degree nodes in the graph, whose outputs would be only the bias "
                           "(as DGL's GATConv, this is an error): add self-loops (dgl.add_self_loop) or make the "
                           "module with allow_zero_in_degree=True")
        num_dst = graph.num_dst_nodes()
        if isinstance(feat, tuple):
            h_src, h_dst = feat
        else:
            h_src = feat
            h_dst = feat[:num_dst] if graph.is_block else feat
        batch = self._kept((id(graph), graph.num_edges()), (graph,), lambda: self._batch(graph))
        out = self._run(batch, {"src": h_src, "dst": h_dst}, h_src.device)["dst"]
        out = out.view(num_dst, self.num_heads, self.out_feats)
        if self.bias is not None:
            out = out + self.bias.view(self.num_heads, self.out_feats)
        return self.activation(out) if self.activation is not None else out

    def _batch(self, graph: Any) -> Batch:
        """The relation as a block of two node types: every destination (its own rows), every source."""
        s, d = _edges(graph, graph.canonical_etypes[0])
        n_src, n_dst = int(graph.num_src_nodes()), int(graph.num_dst_nodes())
        return Batch(self._NTYPES, [self._CET], num_src={"src": n_src, "dst": n_dst}, num_dst={"dst": n_dst},
                     edges={self._CET: (s, d)}, name="dgl relation")

    def _rgtune_params(self, graph: HeteroGraph | Batch) -> dict[str, Tensor]:
        heads, d = self.num_heads, self.out_feats
        return {"weight": self.fc.weight.T.unsqueeze(0), "attn_src": self.attn_l.view(1, heads, d),
                "attn_dst": self.attn_r.view(1, heads, d)}

    def extra_repr(self) -> str:
        return f"{self.in_feats}, {self.out_feats}, num_heads={self.num_heads}"


#: DGL's aggregations across relations by name
_AGGREGATES = ("sum", "max", "min", "mean", "stack")


class _Aggregate:
    """DGL's cross-relation aggregation by name (``stack``: on dimension 1; the others over the relations);
    a class, so a module holding one pickles."""

    def __init__(self, agg: str) -> None:
        self.agg = agg

    def __call__(self, outs: list[Tensor], dsttype: str) -> Tensor | None:
        if not outs:
            return None
        if self.agg == "stack":
            return torch.stack(outs, dim=1)
        stacked = torch.stack(outs, dim=0)
        if self.agg in ("max", "min"):
            return getattr(torch, self.agg)(stacked, dim=0)[0]
        return getattr(torch, self.agg)(stacked, dim=0)


class HeteroGraphConv(DropIn):
    r"""DGL's ``HeteroGraphConv``, the container: one module per relation (``mods``: edge type or canonical
    edge type -> module, found as DGL finds them), each called on its relation's graph with
    ``(source features, destination features)`` and its ``mod_args[etype]`` / ``mod_kwargs[etype]``, the
    outputs of each destination type combined by ``aggregate`` (``"sum"``, ``"max"``, ``"min"``, ``"mean"``,
    ``"stack"`` on dimension 1, or a callable ``f(outputs, dsttype)``); a relation whose source (or, on a
    block or a pair, destination) type has no input is skipped, and only the destination types that a
    called relation reaches have an output, as DGL's.

    The modules are any modules: a container of DGL's ``GraphConv`` (or a user's module) calls them as DGL's
    does, which is the container's semantics, not a fallback of an rgtune conv. :class:`GATConv` modules
    (rgtune's) run on rgtune's kernels either way: when every module is one, of one size, without an
    ``activation``, and ``aggregate``
    is ``"sum"`` or ``"mean"`` with no ``mod_args``/``mod_kwargs``, the container runs every relation at once,
    one RGAT program with ``softmax="relation"`` (each relation's attention sums to one at a destination),
    the biases after it (``"mean"``: the sum times one over the number of relations called for that
    destination type, as DGL averages them); with another aggregate each relation's GAT runs its own rgtune
    program and DGL's aggregate combines them.

    On a block (``dgl.to_block``, a sampler's) only the destinations' rows are computed; DGL's
    ``(source, destination)`` pair gives the destinations' rows from its second dict (their gradients go
    there). Keyword-only (rgtune's): backend, db, mode, as :class:`RelGraphConv`; they apply to the one
    program of the fused form (a module keeps its own).
    """

    model = "rgat"

    def __init__(self, mods: dict[Any, torch.nn.Module], aggregate: str | Callable[..., Any] = "sum", *,
                 backend: str = "auto", db: Any = "results.db", mode: str = "training") -> None:
        super().__init__()
        name = type(self).__name__
        if isinstance(aggregate, str) and aggregate not in _AGGREGATES:
            raise ValueError(f"{name}: aggregate={aggregate!r} is not one of DGL's cross-relation aggregations "
                             f"{list(_AGGREGATES)} (or a callable f(outputs, dsttype))")
        self.mod_dict = mods
        self.mods = torch.nn.ModuleDict({str(k): v for k, v in mods.items()})
        for mod in self.mods.values():
            allow = getattr(mod, "set_allow_zero_in_degree", None)
            if callable(allow):
                allow(True)  # as DGL's HeteroGraphConv does
        self.aggregate = aggregate
        self.agg_fn = _Aggregate(aggregate) if isinstance(aggregate, str) else aggregate
        sizes = {_gat_sizes(m) for m in mods.values() if isinstance(m, GATConv)}
        #: every relation at once on rgtune's kernels (every module rgtune's GATConv of one size, summed or averaged)
        self._fused = (bool(mods) and all(isinstance(m, GATConv) and m.activation is None for m in mods.values())
                       and len(sizes) == 1 and aggregate in ("sum", "mean"))
        in_feats, out_feats, heads = next(iter(sizes)) if self._fused else (1, 1, 1)
        self.out_feats, self.num_heads = out_feats, heads
        self._relation_graphs: dict[tuple[int, Any], tuple[Any, Any]] = {}
        self._setup(in_feats, heads * out_feats, heads, {"softmax": "relation"}, backend, db, mode)

    def _get_module(self, cet: tuple[str, str, str]) -> torch.nn.Module:
        """The module of a relation: by its canonical edge type, else by its edge type (DGL's lookup)."""
        mod = self.mod_dict.get(cet, None)
        if mod is None:
            mod = self.mod_dict.get(cet[1], None)
        if mod is None:
            raise KeyError(f"{type(self).__name__}: no module for edge type {cet}; mods has {list(self.mod_dict)}")
        return mod

    _mod = _get_module

    def forward(self, g: Any, inputs: Any, mod_args: dict[str, Any] | None = None,
                mod_kwargs: dict[str, Any] | None = None) -> dict[str, Tensor]:
        mod_args, mod_kwargs = mod_args or {}, mod_kwargs or {}
        pair = isinstance(inputs, tuple)
        block = bool(g.is_block)
        if pair:
            src_inputs, dst_inputs = inputs
        elif block:
            src_inputs = inputs
            dst_inputs = {k: v[:g.num_dst_nodes(k)] for k, v in inputs.items() if k in g.dsttypes}
        else:
            src_inputs = dst_inputs = inputs
        called = []
        for cet in g.canonical_etypes:
            stype, _, dtype = cet
            if stype not in src_inputs or ((pair or block) and dtype not in dst_inputs):
                continue
            if dtype not in dst_inputs:
                raise KeyError(f"{type(self).__name__}: inputs have no features of node type {dtype!r}, the "
                               f"destinations of {cet} (its sources {stype!r} have)")
            called.append(tuple(cet))
        if self._fused and not any(c[1] in mod_args or c[1] in mod_kwargs for c in called):
            return self._fused_forward(g, src_inputs, dst_inputs, called, pair, block)
        outputs: dict[str, list[Any]] = {t: [] for t in g.dsttypes}
        for cet in called:
            stype, etype, dtype = cet
            out = self._get_module(cet)(self._relation_graph(g, cet), (src_inputs[stype], dst_inputs[dtype]),
                                        *mod_args.get(etype, ()), **mod_kwargs.get(etype, {}))
            outputs[dtype].append(out)
        return {t: self.agg_fn(alist, t) for t, alist in outputs.items() if alist}

    def _relation_graph(self, g: Any, cet: tuple[str, str, str]) -> Any:
        """``g[cet]``, the same object while ``g`` comes back (so a module's graph of it is kept)."""
        key = (id(g), cet)
        kept = self._relation_graphs.get(key)
        if kept is None or kept[0] is not g:
            if len(self._relation_graphs) > 64:
                self._relation_graphs.clear()
            kept = self._relation_graphs[key] = (g, g[cet])
        return kept[1]

    def _fused_forward(self, g: Any, src_inputs: dict[str, Tensor], dst_inputs: dict[str, Tensor],
                       called: list[tuple[str, str, str]], pair: bool, block: bool) -> dict[str, Tensor]:
        """Every called relation at once: one RGAT program with ``softmax="relation"``. A type whose
        destinations' rows are not its sources' first rows (a pair's) gets them prepended as extra source
        rows (the edges read the sources behind them)."""
        ntypes = sorted(set(g.srctypes) | set(g.dsttypes))
        dst_types = {c[2] for c in called}
        separate = sorted(t for t in dst_types if pair and t in src_inputs and g.num_dst_nodes(t)
                          and not _is_prefix(dst_inputs[t], src_inputs[t]))
        full = (not block and not separate and len(called) == len(g.canonical_etypes))
        key = (id(g), g.num_edges(), tuple(called), tuple(separate), full)
        graph: HeteroGraph | Batch = self._kept(key, (g,), lambda: from_dgl(g, name="dgl") if full
                                                else self._batch(g, ntypes, called, separate, block))
        sizes = ({t: graph.num_nodes(t) for t in graph.ntypes} if isinstance(graph, HeteroGraph) else graph.num_src)
        device = next(iter(src_inputs.values())).device
        in_dim = self._sizes[0]
        x: dict[str, Tensor] = {}
        for t in graph.ntypes:
            n_dst = int(g.num_dst_nodes(t)) if t in g.dsttypes else 0
            if t in separate:
                x[t] = torch.cat([dst_inputs[t], src_inputs[t]])
            elif t in src_inputs:
                x[t] = src_inputs[t]
            elif t in dst_inputs and n_dst:
                v = dst_inputs[t]
                x[t] = torch.cat([v, v.new_zeros(sizes[t] - v.size(0), in_dim)]) if sizes[t] > v.size(0) else v
            elif sizes[t]:
                x[t] = torch.zeros(sizes[t], in_dim, device=device)  # read by no called relation
        out = self._run(graph, x, device)
        result = {}
        for t in sorted(dst_types, key=list(g.dsttypes).index):
            rels = [c for c in called if c[2] == t]
            biases = [m.bias for c in rels if (m := self._get_module(c)).bias is not None]
            h = out[t] + sum(biases) if biases else out[t]  # each relation's GATConv adds its bias
            if self.aggregate == "mean":
                h = h / len(rels)
            result[t] = h.view(h.size(0), self.num_heads, self.out_feats)
        return result

    @staticmethod
    def _batch(g: Any, ntypes: list[str], called: list[tuple[str, str, str]], separate: list[str],
               block: bool) -> Batch:
        """``g`` as a :class:`Batch` of the called relations' edges (every relation of ``g`` a relation of it),
        each of ``separate``'s types with its destinations prepended to its sources."""
        num_src, num_dst, shift = {}, {}, {}
        for t in ntypes:
            n_src = int(g.num_src_nodes(t)) if t in g.srctypes else 0
            n_dst = int(g.num_dst_nodes(t)) if t in g.dsttypes else 0
            shift[t] = n_dst if t in separate else 0
            num_src[t], num_dst[t] = max(n_src + shift[t], n_dst), n_dst
        edges = {}
        for cet in called:
            s, d = _edges(g, cet)
            edges[cet] = (s + shift[cet[0]], d)
        cets = sorted(tuple(c) for c in g.canonical_etypes)
        return Batch(ntypes, cets, num_src=num_src, num_dst=num_dst, edges=edges,
                     name="dgl block" if block else "dgl")

    def _rgtune_params(self, graph: HeteroGraph | Batch) -> dict[str, Tensor]:
        """Per relation its module's ``fc.weight`` (transposed), ``attn_l`` (the source's attention vector)
        and ``attn_r`` (the destination's), per head."""
        mods = [self._get_module(c) for c in graph.canonical_etypes]
        heads, d = self.num_heads, self.out_feats
        return {"weight": torch.stack([m.fc.weight.T for m in mods]),
                "attn_src": torch.stack([m.attn_l.view(heads, d) for m in mods]),
                "attn_dst": torch.stack([m.attn_r.view(heads, d) for m in mods])}

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_relation_graphs"] = {}
        return state
