"""DGL's usual relational GAT with the weights of an rgtune RGAT copied in: a check of ``rgat(softmax="relation")``.

DGL writes an RGAT as ``HeteroGraphConv({rel: GATConv(in, out // heads, heads, bias=False,
allow_zero_in_degree=True) for each relation}, aggregate="sum")``: per relation ``r`` and head,
``z_j = W_r h_j``, ``e_ij = LeakyReLU(a_l . z_j + a_r . W_r h_i)`` (``attn_l`` on the source side,
``attn_r`` on the destination side, one ``fc`` for both), a softmax over ``i``'s in-edges *of
relation r*, ``sum_j alpha_ij z_j``, and the relations' results summed. That is rgtune's
:func:`rgtune.ir.models.rgat` with ``softmax="relation"``, whose state is ``weight (R, in, H*D)``
(``z = x W_r``, so ``fc.weight`` is ``W_r^T``), ``attn_src (R, H, D)`` (``attn_l``) and ``attn_dst
(R, H, D)`` (``attn_r``).

:func:`to_dgl_rgat` builds that module and wraps it in :class:`DglRgat`, which takes and returns
node features in rgtune's global node order (``HeteroGraphConv`` takes and returns them per node
type, and leaves out the node types no relation points to: their rows are zero, as rgtune's).

Example (needs ``dgl``):
    >>> import torch
    >>> from rgtune.data import HeteroGraph
    >>> from rgtune.ir.interpret import Interpreter, random_params
    >>> from rgtune.ir.models import rgat
    >>> g = HeteroGraph({"a": 3, "b": 2}, {("a", "r", "b"): ([0, 1, 2], [0, 0, 1]), ("b", "s", "b"): ([0], [1])})
    >>> program = rgat(4, 6, 2, softmax="relation")
    >>> state = random_params(program, g)
    >>> x = torch.randn(5, 4, dtype=torch.float64)
    >>> dgl_rgat = to_dgl_rgat(g, state, 4, 6, 2)
    >>> torch.allclose(dgl_rgat(x), Interpreter(program, g).run(x, state).output)
    True
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import Tensor

from rgtune.data.graph import HeteroGraph
from rgtune.data.interop import to_dgl

__all__ = ["DglRgat", "to_dgl_rgat"]


class DglRgat(torch.nn.Module):
    """``conv`` (DGL's ``HeteroGraphConv`` of ``GATConv`` s) on ``dgl_graph``, in rgtune's node order:
    ``forward(x (N, in)) -> (N, heads * head_dim)``."""

    def __init__(self, graph: HeteroGraph, conv: torch.nn.Module, heads: int, head_dim: int) -> None:
        super().__init__()
        self.graph = graph
        self.conv = conv
        self.dgl_graph = to_dgl(graph)
        self.heads, self.head_dim = heads, head_dim

    def forward(self, x: Tensor) -> Tensor:
        g = self.graph
        if x.shape[0] != g.num_nodes():
            raise ValueError(f"x has {x.shape[0]} rows; the graph has {g.num_nodes()} nodes")
        dg = self.dgl_graph if self.dgl_graph.device == x.device else self.dgl_graph.to(x.device)
        per_type = self.conv(dg, g.split_nodes(x))
        width = self.heads * self.head_dim
        out = x.new_zeros(g.num_nodes(), width)
        for t, rows in per_type.items():  # node types without in-edges are left out: zero rows
            start = int(g.node_offsets[g.ntype_id(t)])
            out[start:start + rows.shape[0]] = rows.reshape(rows.shape[0], width)
        return out


def to_dgl_rgat(graph: HeteroGraph, state: Mapping[str, Tensor], in_dim: int, out_dim: int,
                heads: int = 1) -> DglRgat:
    """DGL's ``HeteroGraphConv({rel: GATConv(...)}, aggregate="sum")`` computing rgtune's
    ``rgat(in_dim, out_dim, heads, softmax="relation")`` with the params ``state`` (the program's
    state params: ``weight``, ``attn_src``, ``attn_dst``), in ``state``'s dtype and device.

    Raises:
        ValueError: ``out_dim`` is not divisible by ``heads``, or a param is missing or has another shape.
        ImportError: DGL is not installed.
    """
    from dgl.nn.pytorch import GATConv, HeteroGraphConv

    if heads < 1 or out_dim % heads:
        raise ValueError(f"out_dim={out_dim} is not divisible by heads={heads}")
    R, H, D = graph.num_rels, heads, out_dim // heads
    shapes = {"weight": (R, in_dim, H * D), "attn_src": (R, H, D), "attn_dst": (R, H, D)}
    for name, shape in shapes.items():
        if name not in state:
            raise ValueError(f"state has no {name!r}; an RGAT's state has {sorted(shapes)}")
        if tuple(state[name].shape) != shape:
            raise ValueError(f"state[{name!r}] has shape {tuple(state[name].shape)}; expected {shape} "
                             f"({R} relations, in_dim={in_dim}, heads={H}, head_dim={D})")
    weight, attn_src, attn_dst = (state[n].detach() for n in shapes)
    mods = {}
    with torch.no_grad():
        for r, cet in enumerate(graph.canonical_etypes):
            gat = GATConv(in_dim, D, H, bias=False, allow_zero_in_degree=True).to(weight.device, weight.dtype)
            gat.fc.weight.copy_(weight[r].T)  # one fc for both ends: z = x W_r
            gat.attn_l.copy_(attn_src[r].view(1, H, D))  # attn_l meets the source's z
            gat.attn_r.copy_(attn_dst[r].view(1, H, D))  # attn_r the destination's
            mods[cet] = gat
    conv = HeteroGraphConv(mods, aggregate="sum")
    return DglRgat(graph, conv, H, D).to(weight.device)
