"""PyG's conv modules on rgtune's generated kernels: change ``from torch_geometric.nn import RGCNConv`` (or
``HGTConv``) to ``from rgtune.nn.pyg import RGCNConv`` and the script runs as it did, faster.
:class:`HGTConv` is described in its own docstring; the rest of this one is :class:`RGCNConv`'s.

:class:`RGCNConv` takes PyG's constructor arguments and call (``conv(x, edge_index, edge_type)``), holds
PyG's parameters under PyG's names and shapes (``weight``, ``comp`` with ``num_bases``, ``root``, ``bias``;
initialized as PyG does), so ``conv.load_state_dict(pyg_conv.state_dict())`` works in both directions
and gives PyG's outputs. The relations are the caller's integers: relation ``r`` of the graph the kernels
run on is ``edge_type == r`` (:func:`~rgtune.data.interop.from_pyg_homogeneous`), never re-sorted.

Which schedule runs is looked up in the trial database on the first call, as
:func:`~rgtune.runtime.load_tuned` does (the graph by content, the sizes, this device): a graph nobody
tuned runs the default schedule, with one :class:`~rgtune.runtime._lookup.TunedScheduleWarning`. The
graph of an ``(edge_index, edge_type)`` pair is built once and kept while the same tensors come back
(full-graph training passes the same ones every epoch); another pair (a sampled subgraph) gets its own.

Example:
    >>> import torch, warnings
    >>> conv = RGCNConv(8, 16, num_relations=3, db=None)
    >>> sorted(conv.state_dict()), tuple(conv.weight.shape)
    (['bias', 'root', 'weight'], (3, 8, 16))
    >>> x, edge_index = torch.randn(10, 8), torch.randint(0, 10, (2, 40))
    >>> edge_type = torch.randint(0, 3, (40,))
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")   # no database: the default schedule, said once
    ...     out = conv(x, edge_index, edge_type)
    >>> out.shape
    torch.Size([10, 16])
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from rgtune.data.graph import HeteroGraph
from rgtune.data.interop import from_pyg_homogeneous
from rgtune.ir.registry import model_spec
from rgtune.nn._dropin import DropIn
from rgtune.runtime import ops
from rgtune.runtime.module import init_param

__all__ = ["RGCNConv", "HGTConv", "FiLMConv", "RGATConv"]

#: PyG's ``aggr`` of ``RGCNConv`` -> rgtune's RGCN option ``aggr``
_AGGRS = {"mean": "mean", "add": "sum", "sum": "sum"}


class _Types(NamedTuple):
    """What rgtune's weights are derived for: a graph's node and edge types, without the graph."""

    ntypes: list[str]
    canonical_etypes: list[tuple[str, str, str]]


class _EdgeTypeConv(DropIn):
    """A conv of PyG's homogeneous form, ``conv(x, edge_index, edge_type)`` (relation ``r``: ``edge_type == r``)."""

    num_relations: int
    in_channels: int

    def forward(self, x: Tensor | None, edge_index: Tensor, edge_type: Tensor | None = None) -> Tensor:
        """``x``: ``(num_nodes, in_channels)``; ``edge_index``: ``(2, num_edges)``; ``edge_type``: ``(num_edges,)``
        in ``0 .. num_relations - 1`` (may be left out with one relation). Returns ``(num_nodes, out_channels)``."""
        name = type(self).__name__
        if x is None or not isinstance(x, Tensor):
            raise ValueError(f"{name}: x must be a (num_nodes, {self.in_channels}) tensor of node features, got "
                             f"{type(x).__name__} (PyG's featureless form, x=None, is not supported: give the nodes "
                             "features, e.g. a torch.nn.Embedding's weight)")
        if not isinstance(edge_index, Tensor):
            raise ValueError(f"{name}: edge_index must be a (2, num_edges) tensor, got {type(edge_index).__name__} "
                             "(a SparseTensor adjacency is not supported)")
        if edge_type is None and self.num_relations > 1:
            raise ValueError(f"{name}: edge_type is needed with num_relations={self.num_relations}")
        if torch.compiler.is_compiling():  # one op: the graph of the tensors is found when it runs
            tensors = [edge_index] if edge_type is None else [edge_index, edge_type]
            return ops.module_forward(self, x, tensors, self._rgtune_params(None))
        return self._run(self._graph(edge_index, edge_type, x.size(0)), x, x.device)

    def _graph_of_tensors(self, x: Tensor, graph_tensors: list[Tensor]) -> HeteroGraph:
        return self._graph(graph_tensors[0], graph_tensors[1] if len(graph_tensors) > 1 else None, x.size(0))

    def _graph(self, edge_index: Tensor, edge_type: Tensor | None, num_nodes: int) -> HeteroGraph:
        """The graph of these tensors, built once while they come back unchanged (same objects, versions)."""
        key = (id(edge_index), edge_index._version, id(edge_type), None if edge_type is None else edge_type._version,
               num_nodes)
        return self._kept(key, (edge_index, edge_type), lambda: from_pyg_homogeneous(
            edge_index, edge_type, num_nodes, self.num_relations, name="pyg"))


class RGCNConv(_EdgeTypeConv):
    r"""PyG's ``RGCNConv``: :math:`x'_i = x_i \Theta_{root} + b + \sum_r \frac{1}{|N_r(i)|}
    \sum_{j \in N_r(i)} x_j \Theta_r`, with ``num_bases`` (:math:`\Theta_r = \sum_b a_{rb} V_b`) or
    ``num_blocks`` (block-diagonal :math:`\Theta_r`), on generated kernels (see the module docstring).

    Args (PyG's):
        in_channels, out_channels: feature sizes (``in_channels`` an int: node features, not PyG's
            featureless ``x=None`` form, nor a bipartite tuple).
        num_relations: edge types ``0 .. num_relations - 1``.
        num_bases, num_blocks: the weight decompositions (at most one).
        aggr: ``"mean"`` (PyG's default) or ``"add"`` (the sum over each relation's in-neighbours).
        root_weight, bias: both ``True`` (PyG's defaults; rgtune's RGCN has both).
        is_sorted: accepted and ignored (edges are grouped by relation when the graph is built).

    Keyword-only (rgtune's):
        backend: ``"auto"`` (the kernels of the device the input is on: ``cuda`` or ``cpu``) or a name.
        db: the trial database the schedule is looked up in (None: the default schedule).
        mode: the schedule looked up: ``"training"`` (a training step's, default) or ``"inference"``.
    """

    model = "rgcn"

    def __init__(self, in_channels: int, out_channels: int, num_relations: int, num_bases: int | None = None,
                 num_blocks: int | None = None, aggr: str = "mean", root_weight: bool = True, is_sorted: bool = False,
                 bias: bool = True, *, backend: str = "auto", db: Any = "results.db", mode: str = "training") -> None:
        super().__init__()
        name = type(self).__name__
        if not isinstance(in_channels, int) or isinstance(in_channels, bool):
            raise ValueError(f"{name}: in_channels={in_channels!r}: rgtune's RGCNConv takes node features of one size "
                             "(an int); PyG's featureless (x=None) and bipartite (a tuple) forms are not supported")
        if aggr not in _AGGRS:
            raise ValueError(f"{name}: aggr={aggr!r} is not supported; rgtune's RGCN takes the mean (PyG's default, "
                             "aggr='mean') or the sum (aggr='add') over each relation's in-neighbours")
        for flag, value in (("root_weight", root_weight), ("bias", bias)):
            if not value:
                raise ValueError(f"{name}: {flag}=False is not supported; rgtune's RGCN has the root weight and the "
                                 f"bias (PyG's defaults, {flag}=True)")
        if isinstance(num_relations, bool) or not isinstance(num_relations, int) or num_relations < 1:
            raise ValueError(f"{name}: num_relations must be a positive int, got {num_relations!r}")
        self.in_channels, self.out_channels, self.num_relations = in_channels, out_channels, num_relations
        self.num_bases, self.num_blocks = num_bases, num_blocks
        self.aggr = aggr
        self.options = {k: v for k, v in (("num_bases", num_bases), ("num_blocks", num_blocks),
                                          ("aggr", None if _AGGRS[aggr] == "mean" else _AGGRS[aggr])) if v is not None}
        spec = model_spec(self.model)
        try:
            self._program = spec.build(in_channels, out_channels, 1, spec.resolve(self.options))
        except ValueError as e:  # a bad decomposition for these sizes, said by the model's builder
            raise ValueError(f"{name}: {e}") from None
        self._setup(in_channels, out_channels, 1, self.options, backend, db, mode)
        for pname, p in self._program.state_params().items():
            count = num_relations if p.by == "rel" else None
            self.register_parameter(pname, init_param(p, count, dtype=torch.float32, device=None))

    def reset_parameters(self) -> None:
        """Fresh parameters, initialized as PyG initializes them (glorot weights, zero bias)."""
        for pname, p in self._program.state_params().items():
            mine = getattr(self, pname)
            count = self.num_relations if p.by == "rel" else None
            with torch.no_grad():
                mine.copy_(init_param(p, count, dtype=mine.dtype, device=mine.device))

    def _rgtune_params(self, graph: HeteroGraph) -> dict[str, Tensor]:
        """PyG's parameters are rgtune's RGCN weights as they are (the same names and shapes)."""
        return {pname: getattr(self, pname) for pname in self._program.state_params()}

    def extra_repr(self) -> str:
        opts = "".join(f", {k}={v}" for k, v in self.options.items())
        return f"{self.in_channels}, {self.out_channels}, num_relations={self.num_relations}{opts}"


class HGTConv(DropIn):
    r"""PyG's ``HGTConv`` (the heterogeneous graph transformer), on generated kernels.

    Its parameters are PyG's own modules (``kqv_lin``, ``out_lin``, ``k_rel``, ``v_rel``, ``skip``, ``p_rel``;
    made by PyG's constructor, so their names, shapes and initialization are PyG's and ``load_state_dict``
    works both ways); each call derives rgtune's HGT weights from them with a few differentiable torch ops
    (gradients flow back to PyG's parameters) and runs the layer's kernels. Node and edge types are mapped
    by name: rgtune's order (sorted names) never meets PyG's numbering of ``metadata``.

    Args (PyG's): in_channels (an int: one size for every node type), out_channels, metadata
    (``(node_types, edge_types)``), heads. Keyword-only (rgtune's): backend, db, mode, as :class:`RGCNConv`.
    Call: ``conv(x_dict, edge_index_dict)`` -> ``{node type: (n_t, out_channels)}``.
    """

    model = "hgt"

    def __init__(self, in_channels: int, out_channels: int, metadata: tuple[list[str], list[tuple[str, str, str]]],
                 heads: int = 1, *, backend: str = "auto", db: Any = "results.db", mode: str = "training",
                 **kwargs: Any) -> None:
        super().__init__()
        name = type(self).__name__
        if not isinstance(in_channels, int) or isinstance(in_channels, bool) or in_channels < 1:
            raise ValueError(f"{name}: in_channels={in_channels!r}: rgtune's HGTConv takes one input size for every "
                             "node type (an int); per-type sizes and lazy (-1) sizes are not supported")
        if kwargs:
            raise ValueError(f"{name}: arguments {sorted(kwargs)} are not supported")
        from torch_geometric.nn import HGTConv as PyGHGTConv  # PyG's parameters, by PyG's own constructor

        pyg = PyGHGTConv(in_channels, out_channels, metadata, heads=heads)
        for child, module in pyg.named_children():
            self.add_module(child, module)
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.node_types = list(metadata[0])
        self.edge_types = [tuple(e) for e in metadata[1]]
        self._pyg_relation = {tuple(k): int(v) for k, v in pyg.edge_types_map.items()}  # PyG's numbering, by name
        self._setup(in_channels, out_channels, heads, {}, backend, db, mode)

    def reset_parameters(self) -> None:
        """Fresh parameters, as PyG's ``HGTConv.reset_parameters`` makes them (ones for ``skip`` and ``p_rel``)."""
        for module in (self.kqv_lin, self.out_lin, self.k_rel, self.v_rel):
            module.reset_parameters()
        with torch.no_grad():
            for p in (*self.skip.values(), *self.p_rel.values()):
                p.fill_(1.0)

    def forward(self, x_dict: dict[str, Tensor], edge_index_dict: dict[Any, Tensor]) -> dict[str, Tensor]:
        name = type(self).__name__
        unknown = [t for t in x_dict if t not in self.node_types]
        if unknown:
            raise ValueError(f"{name}: x_dict has node types {unknown} that metadata does not have: {self.node_types}")
        unknown = [tuple(c) for c in edge_index_dict if tuple(c) not in self._pyg_relation]
        if unknown:
            raise ValueError(f"{name}: edge type {unknown[0]} is not in metadata: {self.edge_types}")
        counts = {t: (x_dict[t].size(0) if t in x_dict else 0) for t in self.node_types}
        if torch.compiler.is_compiling():  # one op: the graph of the tensors is found when it runs
            return self._traced(x_dict, edge_index_dict, counts)
        graph = self._graph(counts, edge_index_dict)
        x = {t: x_dict[t] for t in graph.ntypes if t in x_dict}
        return dict(self._run(graph, x, next(iter(x_dict.values())).device))

    def _traced(self, x_dict: dict[str, Tensor], edge_index_dict: dict[Any, Tensor],
                counts: dict[str, int]) -> dict[str, Tensor]:
        """The call under torch.compile (:func:`rgtune.runtime.ops.module_forward`): the graph's node types
        (sorted, every one of ``metadata``) and relations (every one of ``metadata``) are known without the
        graph, so rgtune's weights are derived in the trace; the counts and which relations came travel to
        the op as tensors (constants of the compiled graph)."""
        types = sorted(self.node_types)
        relations = [c for c in self.edge_types if c in edge_index_dict]
        given = [(tuple(k), v) for k, v in edge_index_dict.items()]
        tensors = [torch.tensor([counts[t] for t in self.node_types]),
                   torch.tensor([self.edge_types.index(c) for c in relations]),
                   *(dict(given)[c] for c in relations)]
        shape = _Types(types, sorted(self.edge_types))
        x = torch.cat([x_dict[t] for t in types if t in x_dict])
        out = ops.module_forward(self, x, tensors, self._rgtune_params(shape))  # type: ignore[arg-type]
        return dict(zip(types, out.split([counts[t] for t in types])))

    def _graph_of_tensors(self, x: Tensor, graph_tensors: list[Tensor]) -> HeteroGraph:
        counts = dict(zip(self.node_types, graph_tensors[0].tolist()))
        relations = [self.edge_types[i] for i in graph_tensors[1].tolist()]
        return self._graph(counts, dict(zip(relations, graph_tensors[2:])))

    def _graph(self, counts: dict[str, int], edge_index_dict: dict[Any, Tensor]) -> HeteroGraph:
        """The graph of these node counts and edge tensors (kept while the same tensors come back); every
        relation of ``metadata`` is in it, with or without edges in this call."""
        key = (tuple(counts.items()), tuple((tuple(k), id(v), v._version) for k, v in edge_index_dict.items()))

        def build() -> HeteroGraph:
            none = (torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
            edges = {c: none for c in self.edge_types}
            for cet, ei in edge_index_dict.items():
                ei = ei.as_subclass(Tensor).to("cpu", torch.int64)
                edges[tuple(cet)] = (ei[0], ei[1])
            return HeteroGraph(counts, edges, name="pyg")

        return self._kept(key, tuple(edge_index_dict.values()), build)

    def _rgtune_params(self, graph: HeteroGraph) -> dict[str, Tensor]:
        """rgtune's HGT weights (``rgtune.ir.models.hgt``) from PyG's parameters, node and edge types by name:
        ``kqv_lin`` holds ``[K | Q | V]^T`` per node type, ``out_lin`` ``A^T``; ``k_rel``/``v_rel`` hold the
        per-(head, relation) attention and message matrices at PyG's index ``head * R + relation``."""
        out, heads, types = self.out_channels, self.heads, graph.ntypes
        kqv = [self.kqv_lin.lins[t] for t in types]
        weights = torch.stack([lin.weight for lin in kqv])  # (T, 3 out, in)
        biases = torch.stack([lin.bias for lin in kqv])  # (T, 3 out)
        rel = torch.tensor([self._pyg_relation[c] for c in graph.canonical_etypes], device=weights.device)
        index = (torch.arange(heads, device=weights.device)[None, :] * len(self.edge_types) + rel[:, None])  # (R, H)
        params = {f"{n}_weight": weights[:, i * out:(i + 1) * out].transpose(1, 2) for i, n in enumerate("kqv")}
        params.update({f"{n}_bias": biases[:, i * out:(i + 1) * out] for i, n in enumerate("kqv")})
        params["a_weight"] = torch.stack([self.out_lin.lins[t].weight.T for t in types])
        params["a_bias"] = torch.stack([self.out_lin.lins[t].bias for t in types])
        params["skip"] = torch.cat([self.skip[t].reshape(1) for t in types])
        params["mu"] = torch.stack([self.p_rel["__".join(c)].reshape(heads) for c in graph.canonical_etypes])
        params["w_att"] = self.k_rel.weight[index]  # (R, H, D, D)
        params["w_msg"] = self.v_rel.weight[index]
        return params

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, heads={self.heads}"


class FiLMConv(_EdgeTypeConv):
    r"""PyG's ``FiLMConv`` (GNN-FiLM): :math:`x'_i = \sigma(\gamma_i \odot W_{skip} x_i + \beta_i) +
    \sum_r \frac{1}{|N_r(i)|} \sum_{j \in N_r(i)} \sigma(\gamma_{r,i} \odot W_r x_j + \beta_{r,i})` with
    ``[beta | gamma]`` of the destination from ``films[r]`` (``film_skip``), on generated kernels.

    Its parameters are PyG's own modules (``lins``, ``films``, ``lin_skip``, ``film_skip``, made by PyG's
    constructor); rgtune's FiLM weights (:func:`rgtune.ir.models.film`) are derived from them in every call.
    Args (PyG's): in_channels (an int), out_channels, num_relations; ``nn``, ``act`` and ``aggr`` at PyG's
    defaults (``None``, ReLU, ``"mean"``). Keyword-only (rgtune's): backend, db, mode. Call:
    ``conv(x, edge_index, edge_type)``, as :class:`RGCNConv`.
    """

    model = "film"

    def __init__(self, in_channels: int, out_channels: int, num_relations: int = 1, nn: Any = None,
                 act: Any = "relu", aggr: str = "mean", *, backend: str = "auto", db: Any = "results.db",
                 mode: str = "training", **kwargs: Any) -> None:
        super().__init__()
        name = type(self).__name__
        if not isinstance(in_channels, int) or isinstance(in_channels, bool) or in_channels < 1:
            raise ValueError(f"{name}: in_channels={in_channels!r}: rgtune's FiLMConv takes node features of one "
                             "size (an int); the bipartite (tuple) form is not supported")
        relu = act == "relu" or isinstance(act, torch.nn.ReLU)
        for what, ok, want in (("nn", nn is None, "None (linear FiLM weights)"), ("act", relu, "ReLU"),
                               ("aggr", aggr == "mean", "'mean'")):
            if not ok:
                raise ValueError(f"{name}: {what}={locals()[what]!r} is not supported; rgtune's FiLM computes PyG's "
                                 f"default, {what}={want}")
        if kwargs:
            raise ValueError(f"{name}: arguments {sorted(kwargs)} are not supported")
        from torch_geometric.nn import FiLMConv as PyGFiLMConv  # PyG's parameters, by PyG's own constructor

        pyg = PyGFiLMConv(in_channels, out_channels, num_relations)
        for child in ("lins", "films", "lin_skip", "film_skip"):
            self.add_module(child, getattr(pyg, child))
        self.in_channels, self.out_channels, self.num_relations = in_channels, out_channels, num_relations
        self._setup(in_channels, out_channels, 1, {}, backend, db, mode)

    def reset_parameters(self) -> None:
        for module in (*self.lins, *self.films, self.lin_skip, self.film_skip):
            module.reset_parameters()

    def _rgtune_params(self, graph: HeteroGraph) -> dict[str, Tensor]:
        """rgtune's FiLM weights from PyG's linears (``W^T``; ``films[r]`` and ``film_skip`` hold ``[beta | gamma]``,
        beta first), relation ``r`` PyG's ``lins[r]``."""
        out = self.out_channels
        films_w = torch.stack([f.weight for f in self.films])  # (R, 2 out, in)
        films_b = torch.stack([f.bias for f in self.films])  # (R, 2 out)
        skip = self.film_skip.weight  # (2 out, in)
        return {"lins": torch.stack([lin.weight for lin in self.lins]).transpose(1, 2),
                "films_beta": films_w[:, :out].transpose(1, 2), "films_gamma": films_w[:, out:].transpose(1, 2),
                "films_beta_bias": films_b[:, :out], "films_gamma_bias": films_b[:, out:],
                "lin_skip": self.lin_skip.weight.T, "film_skip_beta": skip[:out].T, "film_skip_gamma": skip[out:].T}

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, num_relations={self.num_relations}"


#: PyG's ``attention_mechanism`` of ``RGATConv`` -> rgtune's RGAT option ``softmax``
_RGAT_SOFTMAX = {"across-relation": "destination", "within-relation": "relation"}


class RGATConv(_EdgeTypeConv):
    r"""PyG's ``RGATConv`` (additive self-attention): per edge :math:`j \to i` of relation ``r``,
    :math:`z = x W_r`, :math:`\alpha_{ij} = \mathrm{softmax}(\mathrm{LeakyReLU}(z_i q + z_j k))` over ``i``'s
    in-edges (``across-relation``) or those of ``r`` (``within-relation``), :math:`x'_i = \sum_j \alpha_{ij} z_j + b`.

    With ``heads`` heads, :math:`z` has ``heads * out`` features and every head's score reads all of them
    (``q``, ``k``: ``(heads * out, heads)``); the heads are concatenated, or averaged with ``concat=False``.
    Its parameters are PyG's own (``weight``, ``q``, ``k``, ``bias``, and the ones PyG keeps for its other
    attention modes); the kernels run rgtune's RGAT with ``attention="mixed"`` on ``weight``, ``q`` and ``k``
    as they are (shared by the relations, as in PyG), and the bias is added after the kernels (after the
    heads' mean), as PyG adds it. Args (PyG's): in_channels, out_channels, num_relations, heads,
    attention_mechanism, attention_mode (``"additive-self-attention"``), concat, negative_slope (0.2), bias;
    the others at PyG's defaults. Keyword-only (rgtune's): backend, db, mode.
    """

    model = "rgat"

    def __init__(self, in_channels: int, out_channels: int, num_relations: int, num_bases: int | None = None,
                 num_blocks: int | None = None, mod: str | None = None,
                 attention_mechanism: str = "across-relation", attention_mode: str = "additive-self-attention",
                 heads: int = 1, dim: int = 1, concat: bool = True, negative_slope: float = 0.2,
                 dropout: float = 0.0, edge_dim: int | None = None, bias: bool = True, *, backend: str = "auto",
                 db: Any = "results.db", mode: str = "training") -> None:
        super().__init__()
        name = type(self).__name__
        given = {"num_bases": num_bases, "num_blocks": num_blocks, "mod": mod, "attention_mode": attention_mode,
                 "dim": dim, "negative_slope": negative_slope, "dropout": dropout, "edge_dim": edge_dim}
        supported = {"num_bases": None, "num_blocks": None, "mod": None, "attention_mode": "additive-self-attention",
                     "dim": 1, "negative_slope": 0.2, "dropout": 0.0, "edge_dim": None}
        for what, value in given.items():
            if value != supported[what]:
                raise ValueError(f"{name}: {what}={value!r} is not supported; rgtune's RGAT computes "
                                 f"{what}={supported[what]!r}")
        if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
            raise ValueError(f"{name}: heads={heads!r}; a positive int")
        if attention_mechanism not in _RGAT_SOFTMAX:
            raise ValueError(f"{name}: attention_mechanism={attention_mechanism!r}; choose one of {list(_RGAT_SOFTMAX)}")
        if not isinstance(in_channels, int) or isinstance(in_channels, bool) or in_channels < 1:
            raise ValueError(f"{name}: in_channels={in_channels!r}: node features of one size (an int)")
        from torch_geometric.nn import RGATConv as PyGRGATConv  # PyG's parameters, by PyG's own constructor

        pyg = PyGRGATConv(in_channels, out_channels, num_relations, attention_mechanism=attention_mechanism,
                          heads=heads, concat=concat, bias=bias)
        for pname, param in pyg.named_parameters(recurse=False):
            self.register_parameter(pname, param)
        for child, module in pyg.named_children():
            self.add_module(child, module)
        self.in_channels, self.out_channels, self.num_relations = in_channels, out_channels, num_relations
        self.attention_mechanism, self.heads, self.concat = attention_mechanism, heads, concat
        options = {"softmax": _RGAT_SOFTMAX[attention_mechanism], "attention": "mixed"}
        self._setup(in_channels, heads * out_channels, heads, options, backend, db, mode)

    def forward(self, x: Tensor | None, edge_index: Tensor, edge_type: Tensor | None = None) -> Tensor:
        out = super().forward(x, edge_index, edge_type)
        if not self.concat:  # PyG averages the heads
            out = out.view(out.size(0), self.heads, self.out_channels).mean(dim=1)
        bias = self._parameters.get("bias")
        return out if bias is None else out + bias  # PyG adds it after the aggregation

    def _rgtune_params(self, graph: HeteroGraph) -> dict[str, Tensor]:
        """PyG's own: ``weight`` ``(R, in, heads * out)``, and ``q`` and ``k`` ``(heads * out, heads)``, rgtune's RGAT
        (``attention="mixed"``) ``attn_dst`` and ``attn_src``, shared by the relations as in PyG."""
        return {"weight": self.weight, "attn_dst": self.q, "attn_src": self.k}

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, num_relations={self.num_relations}, heads={self.heads}, "
                f"attention_mechanism={self.attention_mechanism!r}")
