"""PyG's ``HGTConv`` on generated kernels."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.parameter import UninitializedParameter

from rgtune.data.graph import HeteroGraph
from rgtune.nn._dropin import DropIn
from rgtune.nn._inputs import edge_list
from rgtune.runtime import ops

__all__ = ["HGTConv"]


class _Types(NamedTuple):
    """What rgtune's weights are derived for: a graph's node and edge types, without the graph."""

    ntypes: list[str]
    canonical_etypes: list[tuple[str, str, str]]


def _size_ok(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and (value == -1 or value >= 1)


def _edge_index(value: Any, name: str) -> Tensor:
    """The ``(2, E)`` edges of a call's edge tensor or adjacency (:func:`rgtune.nn._inputs.edge_list`)."""
    return edge_list(value, name).edge_index


class HGTConv(DropIn):
    r"""PyG's ``HGTConv`` (the heterogeneous graph transformer), on generated kernels.

    Its parameters are PyG's own modules (``kqv_lin``, ``out_lin``, ``k_rel``, ``v_rel``, ``skip``, ``p_rel``;
    made by PyG's constructor, so their names, shapes and initialization are PyG's and ``load_state_dict``
    works both ways); each call derives rgtune's HGT weights from them with a few differentiable torch ops
    (gradients flow back to PyG's parameters) and runs the layer's kernels. Node and edge types are mapped
    by name: rgtune's order (sorted names) never meets PyG's numbering of ``metadata``.

    Args (PyG's): in_channels (an int for every node type, a dict ``{node type: size}``, ``-1`` for a size
    read from the first call's ``x_dict``, lazily as PyG's ``HeteroDictLinear``: its weights are
    uninitialized until then, and a type missing from the first call gets its size when it first comes),
    out_channels, metadata (``(node_types, edge_types)``), heads. Keyword-only (rgtune's): backend, db,
    mode, as :class:`RGCNConv`.

    Call: ``conv(x_dict, edge_index_dict)``, each edge type's value a ``(2, E)`` ``edge_index`` or a
    transposed sparse adjacency (``torch.sparse`` COO/CSR/CSC, ``torch_sparse.SparseTensor``). Returns, as
    PyG, ``{node type: (n_t, out_channels)}`` for the node types of ``x_dict`` that are the destination of
    an edge type of ``metadata``, in ``metadata``'s order (``in_channels``' keys' for a dict); a type that receives no message in this call gets
    ``out_lin(gelu(0))`` (its bias, and the skip). The gated skip of a type exists, as in PyG, only where its
    input size equals ``out_channels``.

    Per-type input sizes are zero-padded to the largest (the program's ``in_dim``): each type's K/Q/V weight
    gets zero rows, its features zero columns. The cost, against a ragged input: the K/Q/V segment GEMM
    reads ``max_t in_t`` columns for every row (``(max_t in_t - in_t) * 3 * out_channels`` wasted
    multiply-adds per row of type ``t``) and a padded copy of each narrower type's features is made per call.
    When the sizes differ, the gated skip runs in torch after the kernels (as PyG runs it after its message
    passing), for the types whose size is ``out_channels``; with one size for all, it is in the program.
    """

    model = "hgt"

    def __init__(self, in_channels: int | Mapping[str, int], out_channels: int,
                 metadata: tuple[list[str], list[tuple[str, str, str]]], heads: int = 1, *, backend: str = "auto",
                 db: Any = "results.db", mode: str = "training", **kwargs: Any) -> None:
        super().__init__()
        name = type(self).__name__
        sizes = in_channels.values() if isinstance(in_channels, Mapping) else [in_channels]
        if not all(_size_ok(s) for s in sizes):
            raise ValueError(f"{name}: in_channels={in_channels!r}: expected a positive int, -1 (lazy), or a dict "
                             "{node type: positive int or -1}")
        if kwargs:
            raise ValueError(f"{name}: arguments {sorted(kwargs)} are not supported")
        # PyG's parameters, by PyG's own constructor
        from torch_geometric.nn import HGTConv as PyGHGTConv

        pyg = PyGHGTConv(dict(in_channels) if isinstance(in_channels, Mapping) else in_channels, out_channels,
                         metadata, heads=heads)
        for child, module in pyg.named_children():
            self.add_module(child, module)
        self.in_channels = dict(pyg.in_channels)  # PyG's: {node type: size or -1}
        self.out_channels, self.heads = out_channels, heads
        self.node_types = list(metadata[0])
        self.edge_types = [tuple(e) for e in metadata[1]]
        self.dst_node_types = {e[-1] for e in self.edge_types}  # PyG's: the types an output is made for
        self._pyg_relation = {tuple(k): int(v) for k, v in pyg.edge_types_map.items()}  # PyG's numbering, by name
        self._setup(out_channels, out_channels, heads, {}, backend, db, mode)
        self._resize()

    def reset_parameters(self) -> None:
        """Fresh parameters, as PyG's ``HGTConv.reset_parameters`` makes them (ones for ``skip`` and ``p_rel``)."""
        for module in (self.kqv_lin, self.out_lin, self.k_rel, self.v_rel):
            module.reset_parameters()
        with torch.no_grad():
            for p in (*self.skip.values(), *self.p_rel.values()):
                p.fill_(1.0)

    # ------------------------------------------------------------------ sizes
    def _type_sizes(self) -> dict[str, int]:
        """The input size of each node type whose K/Q/V weight is initialized (all but lazy types not met yet)."""
        return {t: int(lin.weight.shape[1]) for t, lin in self.kqv_lin.lins.items()
                if not isinstance(lin.weight, UninitializedParameter)}

    def _resize(self) -> None:
        """The program's sizes and options from the types' input sizes: ``in_dim`` the largest (the others
        zero-padded), the gated skip in the program when every type has one size, else in torch."""
        sizes = self._type_sizes()
        in_dim = max(sizes.values(), default=self.out_channels)
        options: dict[str, Any] = {} if len(set(sizes.values())) <= 1 else {"skip": "none"}
        if (in_dim, options) != (self._sizes[0], self.options):
            self._sizes, self.options = (in_dim, self.out_channels, self.heads), options
            self._layers.clear()
            self.__dict__["_layer"] = None

    def _initialize(self, x_dict: Mapping[str, Tensor]) -> None:
        """Lazy sizes fixed as PyG's forward fixes them: ``kqv_lin``'s first call initializes the types of its
        input (PyG's ``HeteroDictLinear.initialize_parameters``), a later call a type met for the first time
        (its ``Linear``'s own hook); the same random numbers, in the same order."""
        if hasattr(self.kqv_lin, "_hook"):
            self.kqv_lin.initialize_parameters(self.kqv_lin, (dict(x_dict),))
        for t, lin in self.kqv_lin.lins.items():
            if t in x_dict and hasattr(lin, "_hook"):
                lin.initialize_parameters(lin, (x_dict[t],))
        self._resize()

    # ------------------------------------------------------------------ the call
    def forward(self, x_dict: dict[str, Tensor], edge_index_dict: dict[Any, Any]) -> dict[str, Tensor]:
        name = type(self).__name__
        unknown = [t for t in x_dict if t not in self.node_types]
        if unknown:
            raise ValueError(f"{name}: x_dict has node types {unknown} that metadata does not have: {self.node_types}")
        # a type a dict in_channels leaves out has no K/Q/V weight: PyG's forward passes over its features
        x_dict = {t: x for t, x in x_dict.items() if t in self.kqv_lin.lins}
        edges: dict[tuple[str, str, str], Tensor] = {}
        for key, value in edge_index_dict.items():
            cet = tuple(key)
            if cet not in self._pyg_relation:
                raise ValueError(f"{name}: edge type {cet} is not in metadata: {self.edge_types}")
            for end in (cet[0], cet[2]):
                if end not in x_dict:
                    raise ValueError(f"{name}: edge_index_dict has edge type {cet}, but x_dict has no features for "
                                     f"its node type {end!r} (PyG's HGTConv needs both ends of every edge type "
                                     f"given); pass x_dict[{end!r}] or leave the edge type out")
            edges[cet] = _edge_index(value, f"edge_index_dict[{cet!r}]")  # type: ignore[index]
        for t, x in x_dict.items():
            if not isinstance(x, Tensor) or x.dim() != 2:
                raise ValueError(f"{name}: x_dict[{t!r}] must be a 2-D tensor (nodes, features), got "
                                 f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
        if not x_dict:
            raise ValueError(f"{name}: x_dict is empty; give the features of at least one node type")
        if not torch.compiler.is_compiling():
            self._initialize(x_dict)
        sizes = self._type_sizes()
        for t, x in x_dict.items():
            if x.size(1) != sizes.get(t, -1):
                raise ValueError(f"{name}: x_dict[{t!r}] has {x.size(1)} features, but node type {t!r} takes "
                                 f"in_channels={sizes.get(t, self.in_channels.get(t))}")
        counts = {t: (x_dict[t].size(0) if t in x_dict else 0) for t in self.node_types}
        in_dim = self._sizes[0]
        padded = {t: x if x.size(1) == in_dim else F.pad(x, (0, in_dim - x.size(1))) for t, x in x_dict.items()}
        if torch.compiler.is_compiling():  # one op: the graph of the tensors is found when it runs
            out = self._traced(padded, edges, counts)
        else:
            graph = self._graph(counts, edge_index_dict, edges)
            x = {t: padded[t] for t in graph.ntypes if t in padded}
            out = dict(self._run(graph, x, next(iter(x_dict.values())).device))
        return self._outputs(x_dict, out)

    def _outputs(self, x_dict: Mapping[str, Tensor], out: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """PyG's output dict: the types of ``x_dict`` that ``metadata`` has edges into, in ``kqv_lin``'s order
        (``metadata``'s, or ``in_channels``' keys), as PyG's; with per-type sizes, the gated skip of the types
        whose input size is ``out_channels`` (PyG's rule)."""
        result = {}
        for t in self.kqv_lin.lins:
            if t not in x_dict or t not in self.dst_node_types:
                continue
            x, h = x_dict[t], out[t]
            if self.options.get("skip") == "none" and x.size(-1) == self.out_channels:
                alpha = self.skip[t].sigmoid()
                h = alpha * h + (1 - alpha) * x
            result[t] = h
        return result

    def _traced(self, x_dict: dict[str, Tensor], edges: dict[tuple[str, str, str], Tensor],
                counts: dict[str, int]) -> dict[str, Tensor]:
        """The call under torch.compile (:func:`rgtune.runtime.ops.module_forward`): the graph's node types
        (sorted, every one of ``metadata``) and relations (every one of ``metadata``) are known without the
        graph, so rgtune's weights are derived in the trace; the counts and which relations came travel to
        the op as tensors (constants of the compiled graph)."""
        types = sorted(self.node_types)
        relations = [c for c in self.edge_types if c in edges]
        tensors = [torch.tensor([counts[t] for t in self.node_types]),
                   torch.tensor([self.edge_types.index(c) for c in relations]),
                   *(edges[c] for c in relations)]
        shape = _Types(types, sorted(self.edge_types))
        x = torch.cat([x_dict[t] for t in types if t in x_dict])
        out = ops.module_forward(self, x, tensors, self._rgtune_params(shape))  # type: ignore[arg-type]
        return dict(zip(types, out.split([counts[t] for t in types])))

    def _graph_of_tensors(self, x: Tensor, graph_tensors: list[Tensor]) -> HeteroGraph:
        counts = dict(zip(self.node_types, graph_tensors[0].tolist()))
        relations = [self.edge_types[i] for i in graph_tensors[1].tolist()]
        edges = dict(zip(relations, graph_tensors[2:]))
        return self._graph(counts, edges, edges)

    def _graph(self, counts: dict[str, int], given: Mapping[Any, Any],
               edges: Mapping[tuple[str, str, str], Tensor]) -> HeteroGraph:
        """The graph of these node counts and edge lists (kept while the same objects of ``given``, the
        caller's edge tensors or adjacencies, come back); every relation of ``metadata`` is in it, with or
        without edges in this call."""
        key = (tuple(counts.items()),
               tuple((tuple(k), id(v), getattr(v, "_version", 0)) for k, v in given.items()))

        def build() -> HeteroGraph:
            none = (torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
            graph_edges = {c: none for c in self.edge_types}
            for cet, ei in edges.items():
                ei = ei.as_subclass(Tensor).to("cpu", torch.int64)
                graph_edges[cet] = (ei[0], ei[1])
            return HeteroGraph(counts, graph_edges, name="pyg")

        return self._kept(key, tuple(given.values()), build)

    def _rgtune_params(self, graph: HeteroGraph) -> dict[str, Tensor]:
        """rgtune's HGT weights (``rgtune.ir.models.hgt``) from PyG's parameters, node and edge types by name:
        ``kqv_lin`` holds ``[K | Q | V]^T`` per node type (zero rows added up to the program's ``in_dim``),
        ``out_lin`` ``A^T``; ``k_rel``/``v_rel`` hold the per-(head, relation) attention and message matrices at
        PyG's index ``head * R + relation``."""
        out, heads, types, in_dim = self.out_channels, self.heads, graph.ntypes, self._sizes[0]
        like = self.out_lin.lins[types[0]].weight
        weights, biases = [], []
        lins = dict(self.kqv_lin.lins.items())  # a dict in_channels may leave a type out
        for t in types:
            lin = lins.get(t)
            if lin is None or isinstance(lin.weight, UninitializedParameter):  # a lazy type not met yet: no rows
                weights.append(like.new_zeros(3 * out, in_dim))
                biases.append(like.new_zeros(3 * out))
                continue
            w = lin.weight
            weights.append(w if w.size(1) == in_dim else F.pad(w, (0, in_dim - w.size(1))))
            biases.append(lin.bias)
        weight = torch.stack(weights)  # (T, 3 out, in)
        bias = torch.stack(biases)  # (T, 3 out)
        rel = torch.tensor([self._pyg_relation[c] for c in graph.canonical_etypes], device=weight.device)
        index = (torch.arange(heads, device=weight.device)[None, :] * len(self.edge_types) + rel[:, None])  # (R, H)
        params = {f"{n}_weight": weight[:, i * out:(i + 1) * out].transpose(1, 2) for i, n in enumerate("kqv")}
        params.update({f"{n}_bias": bias[:, i * out:(i + 1) * out] for i, n in enumerate("kqv")})
        params["a_weight"] = torch.stack([self.out_lin.lins[t].weight.T for t in types])
        params["a_bias"] = torch.stack([self.out_lin.lins[t].bias for t in types])
        params["skip"] = torch.cat([self.skip[t].reshape(1) for t in types])
        params["mu"] = torch.stack([self.p_rel["__".join(c)].reshape(heads) for c in graph.canonical_etypes])
        params["w_att"] = self.k_rel.weight[index]  # (R, H, D, D)
        params["w_msg"] = self.v_rel.weight[index]
        return params

    def __repr__(self) -> str:  # PyG's, whatever in_channels was
        return f"{type(self).__name__}(-1, {self.out_channels}, heads={self.heads})"
