"""PyG's ``HGTConv`` on generated kernels."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from rgtune.data.graph import HeteroGraph
from rgtune.nn._dropin import DropIn
from rgtune.runtime import ops

__all__ = ["HGTConv"]


class _Types(NamedTuple):
    """What rgtune's weights are derived for: a graph's node and edge types, without the graph."""

    ntypes: list[str]
    canonical_etypes: list[tuple[str, str, str]]


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
