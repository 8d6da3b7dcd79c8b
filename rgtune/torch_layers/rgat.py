"""RGAT as a plain torch layer (Hector's and Graphiler's relational GAT)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from rgtune.data.graph import HeteroGraph
from rgtune.torch_layers._base import RelationalLayer, edge_softmax, glorot_, segment_matmul

__all__ = ["RGAT"]


class RGAT(RelationalLayer):
    r"""Relational graph attention, as in Hector and Graphiler: one softmax over all in-edges.

    For every edge :math:`j \to i` of relation :math:`r` and head :math:`h`
    (``H = heads``, ``D = out_dim // H``; :math:`[\cdot]_h` is the ``h``-th block of ``D`` columns):

    .. math::
        z_{j,r} &= h_j W_r \qquad (H \cdot D \text{ columns}) \\
        e_{ij,h} &= \mathrm{LeakyReLU}_{0.2}\big(\langle a^{dst}_{r,h}, [h_i W_r]_h \rangle
                                             + \langle a^{src}_{r,h}, [z_{j,r}]_h \rangle\big) \\
        \alpha_{ij,h} &= \operatorname{softmax}_{(j, r) \to i}\, e_{ij,h}
                         \quad\text{(over all in-edges of } i \text{, across relations)} \\
        [h'_i]_h &= \sum_{(j, r) \to i} \alpha_{ij,h} [z_{j,r}]_h

    The output is ``(num_nodes, H * D)``, heads concatenated (column ``h * D + d``). A node
    with no in-edges outputs zeros. There is no bias and no self-connection.

    Parameters (``R = graph.num_rels``, relation ``r`` is ``graph.canonical_etypes[r]``):

    =========  ======================  ==================================================
    name       shape                   meaning
    =========  ======================  ==================================================
    weight     ``(R, in_dim, H * D)``  ``weight[r]`` is :math:`W_r`; column ``h * D + d``
    attn_src   ``(R, H, D)``           ``attn_src[r, h]`` is :math:`a^{src}_{r,h}`
    attn_dst   ``(R, H, D)``           ``attn_dst[r, h]`` is :math:`a^{dst}_{r,h}`
    =========  ======================  ==================================================

    Init: Glorot uniform, ``weight`` per relation, ``attn_*`` per relation over ``(H, D)``
    (as PyG's ``GATConv`` initializes its attention vectors).

    Example:
        >>> import torch
        >>> from rgtune.data import HeteroGraph
        >>> g = HeteroGraph({"a": 2, "b": 3}, {("a", "r", "b"): ([0, 1, 1], [0, 0, 2])})
        >>> layer = RGAT(g, in_dim=4, out_dim=8, heads=2).double()
        >>> out = layer(torch.randn(5, 4, dtype=torch.float64))
        >>> out.shape, bool(out[:2].eq(0).all())   # nodes of type "a" have no in-edges
        (torch.Size([5, 8]), True)
    """

    negative_slope: float = 0.2

    def __init__(
        self,
        graph: HeteroGraph,
        in_dim: int,
        out_dim: int,
        heads: int = 1,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(graph, in_dim, out_dim, heads=heads, device=device)
        fk = {"device": device, "dtype": dtype}
        R, H, D = self.num_rels, self.heads, self.head_dim
        self.weight = torch.nn.Parameter(torch.empty(R, in_dim, H * D, **fk))
        self.attn_src = torch.nn.Parameter(torch.empty(R, H, D, **fk))
        self.attn_dst = torch.nn.Parameter(torch.empty(R, H, D, **fk))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        glorot_(self.weight)
        glorot_(self.attn_src)
        glorot_(self.attn_dst)

    def _forward_flat(self, x: Tensor) -> Tensor:
        N, H, D = x.size(0), self.heads, self.head_dim
        # Per edge, both ends through the edge's relation weight (edges are grouped by relation).
        z_src = segment_matmul(x.index_select(0, self.src), self.rel_offsets, self.weight).view(-1, H, D)
        z_dst = segment_matmul(x.index_select(0, self.dst), self.rel_offsets, self.weight).view(-1, H, D)
        score = (z_dst * self.attn_dst.index_select(0, self.etype)).sum(-1) + (
            z_src * self.attn_src.index_select(0, self.etype)
        ).sum(-1)
        score = F.leaky_relu(score, self.negative_slope)  # (E, H)
        alpha = edge_softmax(score, self.dst, N)  # over all in-edges of each destination, per head
        out = x.new_zeros(N, H, D).index_add_(0, self.dst, alpha.unsqueeze(-1) * z_src)
        return out.view(N, H * D)
