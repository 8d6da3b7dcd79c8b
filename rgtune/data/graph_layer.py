"""A torch module bound to one graph's node and edge types: its sizes, its input and output forms.

Every layer of rgtune (the generic :class:`rgtune.runtime.Layer` and the plain torch layers of
:mod:`rgtune.torch_layers`) computes on one tensor in the graph's *global* node order (node types one
after another, in ``graph.ntypes`` order). A caller may also give the input per node type, as a dict;
the output then comes back in the same form. :class:`GraphLayer` holds the sizes, validates the input
and converts between the two forms.
"""

from __future__ import annotations

from typing import Mapping, Union

import torch
from torch import Tensor

from rgtune.data.graph import HeteroGraph

__all__ = ["NodeInput", "GraphLayer"]

#: a layer's input or output: one tensor in global node order, or a dict per node type
NodeInput = Union[Tensor, Mapping[str, Tensor]]


class GraphLayer(torch.nn.Module):
    """A module bound to one graph's node and edge types: sizes, validated input, dict <-> tensor.

    What the torch layers and the generic layer (:class:`rgtune.runtime.Layer`) share.
    Subclasses implement :meth:`_forward_flat` (global node order in, global node order out).

    Attributes:
        graph: the bound :class:`HeteroGraph`.
        in_dim, out_dim, heads: sizes; ``head_dim = out_dim // heads``.
        node_offsets: ``T + 1`` Python ints, the global node id range of each node type.
        rel_offsets: ``R + 1`` Python ints, the global edge id range of each relation.
    """

    def __init__(self, graph: HeteroGraph, in_dim: int, out_dim: int, heads: int = 1) -> None:
        super().__init__()
        if not isinstance(graph, HeteroGraph):
            raise TypeError(f"{type(self).__name__}: expected a rgtune HeteroGraph, got {type(graph).__name__}")
        for name, v in (("in_dim", in_dim), ("out_dim", out_dim), ("heads", heads)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{type(self).__name__}: {name} must be a positive int, got {v!r}")
        if out_dim % heads != 0:
            raise ValueError(
                f"{type(self).__name__}: out_dim must be divisible by heads, got out_dim={out_dim}, heads={heads}"
            )
        if graph.num_rels == 0:
            raise ValueError(
                f"{type(self).__name__}: graph {graph.name!r} has no relations (canonical edge types); "
                f"expected at least 1, got 0"
            )
        self.graph = graph
        self.in_dim = in_dim
        self.out_dim = out_dim
        self.heads = heads
        self.head_dim = out_dim // heads
        self.node_offsets: list[int] = [int(v) for v in graph.node_offsets]
        self.rel_offsets: list[int] = [int(v) for v in graph.rel_offsets]

    @property
    def num_nodes(self) -> int:
        return self.node_offsets[-1]

    @property
    def num_ntypes(self) -> int:
        return len(self.node_offsets) - 1

    @property
    def num_rels(self) -> int:
        return len(self.rel_offsets) - 1

    def _param_dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    # ------------------------------------------------------------------ input / output
    def _check_tensor(self, x: Tensor, rows: int, what: str) -> None:
        name = type(self).__name__
        if not isinstance(x, Tensor):
            raise TypeError(f"{name}: {what} must be a torch.Tensor, got {type(x).__name__}")
        if not torch.is_floating_point(x):
            raise ValueError(f"{name}: {what} must have a floating dtype, expected {self._param_dtype()}, got {x.dtype}")
        if x.dtype != self._param_dtype():
            raise ValueError(
                f"{name}: {what} has dtype {x.dtype}, expected {self._param_dtype()} (the layer's dtype; "
                f"convert the input or the layer, e.g. layer.double())"
            )
        if x.dim() != 2:
            raise ValueError(f"{name}: {what} must be 2-D (rows, in_dim), expected (*, {self.in_dim}), got shape {tuple(x.shape)}")
        if x.size(0) != rows:
            raise ValueError(f"{name}: {what} has the wrong number of rows: expected {rows}, got {x.size(0)}")
        if x.size(1) != self.in_dim:
            raise ValueError(f"{name}: {what} has the wrong feature size: expected in_dim={self.in_dim}, got {x.size(1)}")

    def _to_flat(self, x: NodeInput, graph: HeteroGraph | None = None) -> tuple[Tensor, bool]:
        """Validate ``x`` (input of the bound graph, or of ``graph``); return it in global node order and
        whether it came as a dict."""
        g = self.graph if graph is None else graph
        offsets = self._offsets(graph)
        if isinstance(x, Mapping):
            ntypes = g.ntypes
            unknown = sorted(set(x) - set(ntypes))
            if unknown:
                raise ValueError(f"{type(self).__name__}: input dict has unknown node types {unknown}; expected {ntypes}")
            parts = []
            for i, t in enumerate(ntypes):
                rows = offsets[i + 1] - offsets[i]
                if t not in x:
                    if rows == 0:  # an empty type may be left out, as HeteroGraph.flatten_nodes allows
                        continue
                    raise ValueError(
                        f"{type(self).__name__}: input dict is missing node type {t!r} ({rows} nodes); "
                        f"expected keys {ntypes}, got {sorted(x)}"
                    )
                self._check_tensor(x[t], rows, f"input for node type {t!r}")
                parts.append(x[t])
            if not parts:
                return torch.zeros(0, self.in_dim, dtype=self._param_dtype(), device=next(self.parameters()).device), True
            return torch.cat(parts, 0), True
        self._check_tensor(x, offsets[-1], "input")
        return x, False

    def _offsets(self, graph: HeteroGraph | None) -> list[int]:
        """Node type offsets of ``graph`` (None: the bound graph's, kept as ints: no tensor read per call,
        which torch.compile would have to break its graph for)."""
        return self.node_offsets if graph is None or graph is self.graph else [int(v) for v in graph.node_offsets]

    def _from_flat(self, out: Tensor, as_dict: bool, graph: HeteroGraph | None = None) -> NodeInput:
        if not as_dict:
            return out
        g = self.graph if graph is None else graph
        offsets = self._offsets(graph)
        return {t: out[offsets[i] : offsets[i + 1]] for i, t in enumerate(g.ntypes)}

    def forward(self, x: NodeInput) -> NodeInput:
        """``x``: ``(num_nodes, in_dim)`` in global node order, or ``{ntype: (n_t, in_dim)}``.

        Returns ``(num_nodes, out_dim)`` or ``{ntype: (n_t, out_dim)}``, the same form as ``x``.
        """
        flat, as_dict = self._to_flat(x)
        return self._from_flat(self._forward_flat(flat), as_dict)

    def _forward_flat(self, x: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def extra_repr(self) -> str:
        heads = f", heads={self.heads}" if self.heads != 1 else ""
        return (
            f"graph={self.graph.name!r}, in_dim={self.in_dim}, out_dim={self.out_dim}{heads}, "
            f"ntypes={self.num_ntypes}, relations={self.num_rels}"
        )
