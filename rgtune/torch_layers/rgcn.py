"""RGCN as a plain torch layer (the same numbers as PyG's ``RGCNConv`` with aggr="mean")."""

from __future__ import annotations

import torch
from torch import Tensor

from rgtune.data.graph import HeteroGraph
from rgtune.torch_layers._base import RelationalLayer, glorot_, segment_matmul

__all__ = ["RGCN"]


class RGCN(RelationalLayer):
    r"""Relational graph convolution (Schlichtkrull et al.), as PyG's ``RGCNConv(aggr="mean")``.

    .. math::
        h'_i = h_i W_0 + b + \sum_{r} \frac{1}{|N_r(i)|} \sum_{j \in N_r(i)} h_j W_r

    where :math:`N_r(i)` are the sources of the edges of relation :math:`r` into node
    :math:`i` (with multiplicity: a repeated edge counts twice) and a relation with no edge
    into :math:`i` contributes nothing. A relation is a canonical edge type
    ``(src type, name, dst type)``: relation id ``r`` is ``graph.canonical_etypes[r]``.

    Parameters (``R = graph.num_rels``, row vector times matrix everywhere):

    ========  ====================  =============================================
    name      shape                 meaning
    ========  ====================  =============================================
    weight    ``(R, in_dim, out)``  ``weight[r]`` is :math:`W_r`
    root      ``(in_dim, out)``     :math:`W_0`, the self-connection
    bias      ``(out,)``            :math:`b`
    ========  ====================  =============================================

    This is exactly PyG ``RGCNConv(in_dim, out, R)``'s ``weight``/``root``/``bias`` with
    ``edge_type`` = our relation id.

    Init: Glorot uniform for ``weight`` (per relation) and ``root``, zeros for ``bias`` (as PyG).

    Example:
        >>> import torch
        >>> from rgtune.data import HeteroGraph
        >>> g = HeteroGraph({"a": 2, "b": 3}, {("a", "r", "b"): ([0, 1, 1], [0, 0, 2])})
        >>> layer = RGCN(g, in_dim=4, out_dim=8).double()
        >>> layer(torch.randn(5, 4, dtype=torch.float64)).shape
        torch.Size([5, 8])
        >>> {t: v.shape for t, v in layer({"a": torch.randn(2, 4).double(), "b": torch.randn(3, 4).double()}).items()}
        {'a': torch.Size([2, 8]), 'b': torch.Size([3, 8])}
    """

    rel_in_degree: Tensor

    def __init__(
        self,
        graph: HeteroGraph,
        in_dim: int,
        out_dim: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(graph, in_dim, out_dim, heads=1, device=device)
        fk = {"device": device, "dtype": dtype}
        self.weight = torch.nn.Parameter(torch.empty(self.num_rels, in_dim, out_dim, **fk))
        self.root = torch.nn.Parameter(torch.empty(in_dim, out_dim, **fk))
        self.bias = torch.nn.Parameter(torch.empty(out_dim, **fk))
        # |N_r(dst)| of every edge: how many edges of its relation enter its destination.
        pairs = graph.unique_pairs("dst")
        self.register_buffer("rel_in_degree", pairs.pair_count[pairs.edge_to_pair].to(device), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        glorot_(self.weight)
        glorot_(self.root)
        torch.nn.init.zeros_(self.bias)

    def _forward_flat(self, x: Tensor) -> Tensor:
        # Messages per edge, h_j W_r; global edges are grouped by relation, so one matmul per relation.
        msg = segment_matmul(x.index_select(0, self.src), self.rel_offsets, self.weight)
        # Mean within (destination, relation): scale each message by 1/|N_r(i)|, then sum at i.
        msg = msg / self.rel_in_degree.unsqueeze(1).to(msg.dtype)
        out = x @ self.root + self.bias
        return out.index_add(0, self.dst, msg)
