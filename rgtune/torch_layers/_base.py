"""What the reference layers share: binding to a graph, input handling, validation, helpers.

A reference layer is a :class:`torch.nn.Module` bound to one :class:`~rgtune.data.HeteroGraph`.
It computes on a single tensor in the graph's *global* node order (node types one after
another, in ``graph.ntypes`` order) and over the graph's *global* edges (relations one after
another, in ``graph.canonical_etypes`` order). Inputs may also be given per node type as a
dict; the output then comes back in the same form.

The helpers here are the three primitives the layers are written in:

* :func:`segment_matmul` -- rows grouped into contiguous segments, each times its own weight
  (a typed linear: segments are node types or relations). It loops over *segments* (types or
  relations), never over nodes or edges.
* :func:`edge_softmax` -- softmax of per-edge scores over each destination's in-edges.
* :func:`glorot_` -- the Glorot/Xavier uniform init PyG uses, over the last two dimensions.

Example:
    >>> import torch
    >>> x = torch.arange(6.0).view(3, 2)
    >>> w = torch.stack([torch.eye(2), 2 * torch.eye(2)])
    >>> segment_matmul(x, [0, 1, 3], w)   # row 0 times w[0], rows 1..2 times w[1]
    tensor([[ 0.,  1.],
            [ 4.,  6.],
            [ 8., 10.]])
    >>> edge_softmax(torch.zeros(3, 1), torch.tensor([0, 0, 1]), num_nodes=2).flatten()
    tensor([0.5000, 0.5000, 1.0000])
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence, Union

import torch
from torch import Tensor

from rgtune.data.graph import HeteroGraph

__all__ = ["NodeInput", "GraphLayer", "RelationalLayer", "segment_matmul", "edge_softmax", "glorot_"]

NodeInput = Union[Tensor, Mapping[str, Tensor]]


def glorot_(t: Tensor) -> Tensor:
    """Uniform in ``±sqrt(6 / (fan_in + fan_out))`` with fans = the last two dims (PyG's ``glorot``).

    Leading dimensions index types/relations/heads, each its own ``fan_in x fan_out`` matrix.
    """
    bound = math.sqrt(6.0 / (t.size(-2) + t.size(-1)))
    with torch.no_grad():
        return t.uniform_(-bound, bound)


def segment_matmul(x: Tensor, offsets: Sequence[int], weight: Tensor) -> Tensor:
    """``out[a:b] = x[a:b] @ weight[s]`` for each segment ``s`` with ``a, b = offsets[s], offsets[s+1]``.

    Args:
        x: ``(M, K)``, or ``(M, H, K)`` for per-head weights.
        offsets: ``S + 1`` non-decreasing row offsets, ``offsets[-1] == M``.
        weight: ``(S, K, N)``, or ``(S, H, K, N)`` (head ``h`` of a row uses ``weight[s, h]``).

    Returns:
        ``(M, N)`` or ``(M, H, N)``. Row vector times matrix, as everywhere in rgtune.
    """
    eq = "mk,kn->mn" if x.dim() == 2 else "mhk,hkn->mhn"
    parts = [torch.einsum(eq, x[a:b], weight[s]) for s, (a, b) in enumerate(zip(offsets[:-1], offsets[1:]))]
    if not parts:  # no segments: nothing to multiply, keep the shape
        return x.new_zeros(x.shape[:-1] + (weight.size(-1),))
    return torch.cat(parts, 0)


def edge_softmax(score: Tensor, dst: Tensor, num_nodes: int) -> Tensor:
    """Softmax of ``score`` (``(E,)`` or ``(E, H)``) over the edges sharing a destination, per head.

    The per-destination maximum is subtracted first for range safety. It is detached, as in
    PyG's ``softmax``: softmax is shift-invariant, so the gradient is unchanged and autograd
    need not differentiate a scatter-max.
    """
    index = dst.view(-1, *([1] * (score.dim() - 1))).expand_as(score)
    shape = (num_nodes,) + tuple(score.shape[1:])
    smax = score.new_full(shape, -math.inf).scatter_reduce(0, index, score.detach(), "amax", include_self=True)
    ex = (score - smax.index_select(0, dst)).exp()
    denom = score.new_zeros(shape).index_add_(0, dst, ex)
    # Each destination's own maximum contributes exp(0) = 1, so denom >= 1 wherever it is read.
    return ex / denom.index_select(0, dst)


class GraphLayer(torch.nn.Module):
    """A module bound to one graph's node and edge types: sizes, validated input, dict <-> tensor.

    What the reference layers and the generic layer (:class:`rgtune.runtime.Layer`) share.
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
        offsets = self.node_offsets if graph is None else [int(v) for v in g.node_offsets]
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

    def _from_flat(self, out: Tensor, as_dict: bool, graph: HeteroGraph | None = None) -> NodeInput:
        if not as_dict:
            return out
        g = self.graph if graph is None else graph
        offsets = self.node_offsets if graph is None else [int(v) for v in g.node_offsets]
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


class RelationalLayer(GraphLayer):
    """Base of the reference layers: a :class:`GraphLayer` that also holds the graph's index tensors.

    Subclasses create their parameters, implement :meth:`reset_parameters` and
    :meth:`_forward_flat`. The index tensors are registered as non-persistent buffers: ``.to(device)``
    moves them, ``.double()`` leaves them alone (they are integers), and the ``state_dict`` holds
    only the parameters, so it moves between reference and tuned layers unchanged.
    """

    src: Tensor
    dst: Tensor
    etype: Tensor
    node_type: Tensor

    def __init__(
        self,
        graph: HeteroGraph,
        in_dim: int,
        out_dim: int,
        heads: int = 1,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(graph, in_dim, out_dim, heads)
        for name in ("src", "dst", "etype", "node_type"):
            self.register_buffer(name, getattr(graph, name).to(device=device, copy=True), persistent=False)
