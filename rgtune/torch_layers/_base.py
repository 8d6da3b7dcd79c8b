"""What the torch layers share: the graph's index tensors, and the primitives they are written in.

A torch layer is a :class:`~rgtune.data.graph_layer.GraphLayer` (a module bound to one graph: its
input and output forms) that computes over the graph's *global* edges (relations one after another,
in ``graph.canonical_etypes`` order).

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
from typing import Sequence

import torch
from torch import Tensor

from rgtune.data.graph import HeteroGraph
from rgtune.data.graph_layer import GraphLayer

__all__ = ["RelationalLayer", "segment_matmul", "edge_softmax", "glorot_"]


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


class RelationalLayer(GraphLayer):
    """Base of the torch layers: a :class:`GraphLayer` that also holds the graph's index tensors.

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
