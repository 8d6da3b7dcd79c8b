"""PyG's homogeneous call form, ``conv(x, edge_index, edge_type)``, shared by RGCNConv, FiLMConv and RGATConv."""

from __future__ import annotations

import torch
from torch import Tensor

from rgtune.data.graph import HeteroGraph
from rgtune.data.interop import from_pyg_homogeneous
from rgtune.nn._dropin import DropIn
from rgtune.runtime import ops

__all__ = ["_EdgeTypeConv"]


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
