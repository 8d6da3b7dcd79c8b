"""PyG's homogeneous call form, ``conv(x, edge_index, edge_type)``, shared by RGCNConv, FiLMConv and RGATConv.

``edge_index`` is a ``(2, E)`` integer tensor or a transposed sparse adjacency (read by
:func:`rgtune.nn._inputs.edge_list`; its values are the edge types where ``edge_type`` is not given).
``x`` is one node tensor or, for a module that says so (:attr:`_EdgeTypeConv.bipartite_ok`), a pair
``(x_src, x_dst)``: the graph the kernels run on then has the sources as nodes ``0 .. num_src - 1`` and the
destinations after them, and the output is the destinations' rows. What the kernels read for a node (the
module's input rows, :meth:`_EdgeTypeConv._node_input`) is the module's to say.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rgtune.data.graph import HeteroGraph
from rgtune.data.interop import from_pyg_homogeneous
from rgtune.nn._dropin import DropIn
from rgtune.nn._inputs import edge_list
from rgtune.runtime import ops

__all__ = ["_EdgeTypeConv"]


class _EdgeTypeConv(DropIn):
    """A conv of PyG's homogeneous form, ``conv(x, edge_index, edge_type)`` (relation ``r``: ``edge_type == r``).

    A subclass may take more input forms: :meth:`_rows` (how many nodes an input stands for: a featureless
    ``None`` or node indices) and :meth:`_node_input` (the kernels' input rows and the call's model options)."""

    num_relations: int
    in_channels: Any
    #: whether ``x`` may be a ``(x_src, x_dst)`` pair (PyG's bipartite message passing)
    bipartite_ok: bool = False

    def forward(self, x: Any, edge_index: Any, edge_type: Tensor | None = None) -> Tensor:
        """``x``: ``(num_nodes, in_channels)`` (or a pair, see the module docstring); ``edge_index``:
        ``(2, num_edges)`` or a transposed sparse adjacency; ``edge_type``: ``(num_edges,)`` in
        ``0 .. num_relations - 1`` (may be left out with one relation). Returns ``(num_nodes, out_channels)``
        (``num_dst`` rows for a pair)."""
        name = type(self).__name__
        edges = edge_list(edge_index, "edge_index")
        if edge_type is None and edges.values is not None:
            if edges.values.is_floating_point():
                raise ValueError(f"{name}: the sparse adjacency's values are read as edge types and must be "
                                 f"integers, got dtype {edges.values.dtype}; give edge_type explicitly")
            edge_type = edges.values  # new each call for a torch.sparse adjacency: the adjacency keys the graph
        if edge_type is None and self.num_relations > 1:
            raise ValueError(f"{name}: edge_type is needed with num_relations={self.num_relations}")
        pair = isinstance(x, (tuple, list))
        if pair and (not self.bipartite_ok or len(x) != 2):
            raise ValueError(f"{name}: x as a pair (x_src, x_dst) is not supported here; give one node tensor")
        x_src, x_dst = (x[0], x[1]) if pair else (x, x)
        src_name, dst_name = ("x[0]", "x[1]") if pair else ("x", "x")
        num_src, num_dst = self._rows(x_src, 0, src_name), self._rows(x_dst, 1, dst_name)
        ei = edges.edge_index
        if edges.size is not None:
            num_src, num_dst = self._check_size(edges.size, num_src, num_dst, pair, src_name, dst_name)
        inputs, options = self._node_input(x_src, x_dst, pair, num_src, num_dst)
        if not pair and options is None and inputs is x and torch.compiler.is_compiling():
            tensors = [ei] if edge_type is None else [ei, edge_type]  # one op: the graph is found when it runs
            return ops.module_forward(self, x, tensors, self._rgtune_params(None))
        # keyed by the caller's own tensors (the same ones every epoch): the edge list read from them is new each call
        graph = self._graph(ei, edge_type, num_src, num_dst if pair else None, holder=edge_index,
                            types_from_holder=edges.values is not None and edge_type is edges.values,
                            names=(src_name, dst_name))
        device = inputs.device
        out = self._run(graph, inputs, device, options)
        return out[num_src:] if pair else out

    # -- what a subclass may change -------------------------------------------------------------------------
    def _rows(self, x: Any, side: int, what: str) -> int:
        """How many nodes the input ``x`` (side 0: sources, 1: destinations) holds."""
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise ValueError(f"{type(self).__name__}: {what} must be a (num_nodes, {self.in_channels}) tensor of node "
                             f"features, got {_describe(x)}")
        return int(x.size(0))

    def _node_input(self, x_src: Any, x_dst: Any, pair: bool, num_src: int, num_dst: int
                    ) -> tuple[Tensor, dict[str, Any] | None]:
        """The rows the kernels read, one per node of the graph (sources, then destinations for a pair), and
        the model options of this call (None: the module's)."""
        if pair:
            raise ValueError(f"{type(self).__name__}: x as a pair is not supported")
        return x_src, None

    # -- internals --------------------------------------------------------------------------------------------
    def _check_size(self, size: tuple[int, int], num_src: int, num_dst: int, pair: bool, src_name: str,
                    dst_name: str) -> tuple[int, int]:
        name = type(self).__name__
        a_src, a_dst = size
        if not pair and a_src != a_dst:
            raise ValueError(f"{name}: the sparse adjacency is {a_dst} x {a_src} (destinations x sources), but one "
                             "node set needs a square one; give x as a pair (x_src, x_dst) for a bipartite graph")
        for what, have, want in ((src_name, num_src, a_src), (dst_name, num_dst, a_dst)):
            if have != want:
                raise ValueError(f"{name}: {what} has {have} rows but the sparse adjacency has {want} "
                                 f"{'sources' if what == src_name and pair else 'nodes' if not pair else 'destinations'}")
        return num_src, num_dst

    def _check_ids(self, ei: Tensor, num_src: int, num_dst: int, pair: bool, src_name: str, dst_name: str) -> None:
        if ei.numel() == 0:
            return
        name = type(self).__name__
        low = int(ei.min())
        if low < 0:
            raise ValueError(f"{name}: edge_index holds a negative node id ({low})")
        for row, what, count in ((0, src_name, num_src), (1, dst_name, num_dst)):
            high = int(ei[row].max())
            if high >= count:
                end = ("source " if row == 0 else "destination ") if pair else ""
                raise ValueError(f"{name}: {what} has {count} rows but edge_index refers to {end}node {high}")

    def _graph_of_tensors(self, x: Tensor, graph_tensors: list[Tensor]) -> HeteroGraph:
        return self._graph(graph_tensors[0], graph_tensors[1] if len(graph_tensors) > 1 else None, x.size(0), None)

    def _graph(self, edge_index: Tensor, edge_type: Tensor | None, num_src: int, num_dst: int | None = None,
               holder: Any = None, types_from_holder: bool = False, names: tuple[str, str] = ("x", "x")
               ) -> HeteroGraph:
        """The graph of these tensors, built once while they come back unchanged (same objects, versions); with
        ``num_dst`` (a bipartite call) the destinations are the nodes after the ``num_src`` sources. ``holder``:
        the caller's argument ``edge_index`` was read from (a tensor or an adjacency), what the graph is kept by."""
        holder = edge_index if holder is None else holder
        version = getattr(holder, "_version", None)
        types = None if types_from_holder else edge_type
        key = (id(holder), version, id(types), None if types is None else types._version, num_src, num_dst)

        def build() -> HeteroGraph:  # the ids are checked against the sizes of the key, once
            self._check_ids(edge_index, num_src, num_src if num_dst is None else num_dst, num_dst is not None, *names)
            ei, nodes = edge_index, num_src
            if num_dst is not None:
                ei = torch.stack([edge_index[0], edge_index[1] + num_src])
                nodes = num_src + num_dst
            return from_pyg_homogeneous(ei, edge_type, nodes, self.num_relations, name="pyg")

        return self._kept(key, (holder, types), build)


def _describe(x: Any) -> str:
    if isinstance(x, Tensor):
        return f"a tensor of dtype {x.dtype}"
    return type(x).__name__
