"""HGT as a plain torch layer (the same numbers as PyG 2.8's ``HGTConv``)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from rgtune.data.graph import HeteroGraph
from rgtune.torch_layers._base import RelationalLayer, edge_softmax, glorot_, segment_matmul

__all__ = ["HGT"]


class HGT(RelationalLayer):
    r"""Heterogeneous Graph Transformer layer (Hu et al.), as PyG's ``HGTConv``.

    ``H = heads``, ``D = out_dim // H``; :math:`\tau(i)` is the node type of ``i``; every
    vector is a row vector and :math:`[\cdot]_h` is its ``h``-th block of ``D`` columns.

    .. math::
        k_j = h_j K_{\tau(j)} + b^K_{\tau(j)}, \quad
        q_i = h_i Q_{\tau(i)} + b^Q_{\tau(i)}, \quad
        v_j = h_j V_{\tau(j)} + b^V_{\tau(j)} \qquad (H \cdot D \text{ columns})

    for every edge :math:`j \to i` of relation :math:`r` and head :math:`h`:

    .. math::
        s_{ij,h} &= \big\langle [q_i]_h,\; [k_j]_h W^{att}_{r,h} \big\rangle \cdot \mu_{r,h} / \sqrt{D} \\
        \alpha_{ij,h} &= \operatorname{softmax}_{(j, r) \to i}\, s_{ij,h}
                         \quad\text{(over all in-edges of } i \text{, across relations)} \\
        [m_i]_h &= \sum_{(j, r) \to i} \alpha_{ij,h}\, [v_j]_h W^{msg}_{r,h}

    and per node, with :math:`o_i = \mathrm{GELU}(m_i)\, A_{\tau(i)} + b^A_{\tau(i)}` (exact erf GELU):

    .. math::
        h'_i = \begin{cases}
            \sigma(s_{\tau(i)})\, o_i + (1 - \sigma(s_{\tau(i)}))\, h_i & \text{if in\_dim = out\_dim (gated skip)} \\
            o_i & \text{otherwise.}
        \end{cases}

    **Nodes without in-edges.** Their aggregate :math:`m_i` is zero, so they output
    :math:`o_i = b^A_{\tau(i)}` (then the gated skip). This holds for *every* node, including
    the nodes of a type that is the destination of no relation. PyG's ``HGTConv`` agrees for
    nodes of destination types, but leaves non-destination node types out of its output dict
    altogether; rgtune outputs them too, by the same per-node rule, so the layer is one
    uniform computation over all nodes (what a generated kernel does) and the output is one
    ``(num_nodes, out_dim)`` tensor.

    Parameters (``T = graph.num_ntypes``, type ``t`` is ``graph.ntypes[t]``;
    ``R = graph.num_rels``, relation ``r`` is ``graph.canonical_etypes[r]``):

    ===========================  =======================  ===================================================
    name                         shape                    meaning
    ===========================  =======================  ===================================================
    k_weight, q_weight, v_weight ``(T, in_dim, H * D)``   :math:`K_t, Q_t, V_t`; column ``h * D + d``
    k_bias, q_bias, v_bias       ``(T, H * D)``           :math:`b^K_t, b^Q_t, b^V_t`
    w_att                        ``(R, H, D, D)``         :math:`W^{att}_{r,h}` (``[k]_h @ w_att[r, h]``)
    w_msg                        ``(R, H, D, D)``         :math:`W^{msg}_{r,h}` (``[v]_h @ w_msg[r, h]``)
    mu                           ``(R, H)``               the prior :math:`\mu_{r,h}`
    a_weight                     ``(T, H * D, out_dim)``  :math:`A_t`
    a_bias                       ``(T, out_dim)``         :math:`b^A_t`
    skip                         ``(T,)``                 the skip gate logit :math:`s_t` (unused unless in_dim == out_dim)
    ===========================  =======================  ===================================================

    ``skip`` always exists, so the parameter set does not depend on the sizes (PyG creates
    it for every node type too).

    Correspondence with PyG 2.8 ``HGTConv(in_dim, out_dim, (graph.ntypes, graph.canonical_etypes), heads)``
    (``F = out_dim``; PyG's linears store ``weight`` as ``(out, in)``, i.e. transposed):
    ``kqv_lin.lins[t].weight = cat(k_weight[t].T, q_weight[t].T, v_weight[t].T)`` (``(3F, in)``,
    rows ``[0, F)`` K, ``[F, 2F)`` Q, ``[2F, 3F)`` V) and likewise its bias;
    ``k_rel.weight[h * R + r] = w_att[r, h]`` and ``v_rel.weight[h * R + r] = w_msg[r, h]``
    (head-major type index, applied as row vector times matrix);
    ``p_rel["__".join(canonical_etypes[r])] = mu[r].view(1, H)``;
    ``out_lin.lins[t].weight = a_weight[t].T``, ``out_lin.lins[t].bias = a_bias[t]``;
    ``skip[t] = skip[t].view(1)``.

    Init: Glorot uniform for every weight (per type, per relation and head), zeros for the
    biases, ones for ``mu`` and ``skip`` (as PyG).

    Example:
        >>> import torch
        >>> from rgtune.data import HeteroGraph
        >>> g = HeteroGraph({"a": 2, "b": 3}, {("a", "r", "b"): ([0, 1, 1], [0, 0, 2])})
        >>> layer = HGT(g, in_dim=8, out_dim=8, heads=2).double()
        >>> out = layer({"a": torch.randn(2, 8).double(), "b": torch.randn(3, 8).double()})
        >>> out["a"].shape, out["b"].shape
        (torch.Size([2, 8]), torch.Size([3, 8]))
    """

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
        T, R, H, D = self.num_ntypes, self.num_rels, self.heads, self.head_dim
        self.k_weight = torch.nn.Parameter(torch.empty(T, in_dim, H * D, **fk))
        self.q_weight = torch.nn.Parameter(torch.empty(T, in_dim, H * D, **fk))
        self.v_weight = torch.nn.Parameter(torch.empty(T, in_dim, H * D, **fk))
        self.k_bias = torch.nn.Parameter(torch.empty(T, H * D, **fk))
        self.q_bias = torch.nn.Parameter(torch.empty(T, H * D, **fk))
        self.v_bias = torch.nn.Parameter(torch.empty(T, H * D, **fk))
        self.w_att = torch.nn.Parameter(torch.empty(R, H, D, D, **fk))
        self.w_msg = torch.nn.Parameter(torch.empty(R, H, D, D, **fk))
        self.mu = torch.nn.Parameter(torch.empty(R, H, **fk))
        self.a_weight = torch.nn.Parameter(torch.empty(T, H * D, out_dim, **fk))
        self.a_bias = torch.nn.Parameter(torch.empty(T, out_dim, **fk))
        self.skip = torch.nn.Parameter(torch.empty(T, **fk))
        self.reset_parameters()

    @property
    def gated_skip(self) -> bool:
        """Whether the output is gated with the input (only possible when in_dim == out_dim)."""
        return self.in_dim == self.out_dim

    def reset_parameters(self) -> None:
        for w in (self.k_weight, self.q_weight, self.v_weight, self.w_att, self.w_msg, self.a_weight):
            glorot_(w)
        for b in (self.k_bias, self.q_bias, self.v_bias, self.a_bias):
            torch.nn.init.zeros_(b)
        torch.nn.init.ones_(self.mu)
        torch.nn.init.ones_(self.skip)

    def _typed_linear(self, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        # Global nodes are grouped by node type: one matmul per type.
        return segment_matmul(x, self.node_offsets, weight) + bias.index_select(0, self.node_type)

    def _forward_flat(self, x: Tensor) -> Tensor:
        N, H, D = x.size(0), self.heads, self.head_dim
        k = self._typed_linear(x, self.k_weight, self.k_bias).view(N, H, D)
        q = self._typed_linear(x, self.q_weight, self.q_bias).view(N, H, D)
        v = self._typed_linear(x, self.v_weight, self.v_bias).view(N, H, D)

        # Per edge (grouped by relation): the source's key and value through the relation's matrices.
        k_e = segment_matmul(k.index_select(0, self.src), self.rel_offsets, self.w_att)  # (E, H, D)
        m_e = segment_matmul(v.index_select(0, self.src), self.rel_offsets, self.w_msg)  # (E, H, D)
        score = (q.index_select(0, self.dst) * k_e).sum(-1) * self.mu.index_select(0, self.etype) / math.sqrt(D)
        alpha = edge_softmax(score, self.dst, N)  # (E, H), over all in-edges of each destination

        agg = x.new_zeros(N, H, D).index_add_(0, self.dst, alpha.unsqueeze(-1) * m_e).view(N, H * D)
        out = self._typed_linear(F.gelu(agg), self.a_weight, self.a_bias)  # exact (erf) GELU, as PyG
        if self.gated_skip:
            gate = torch.sigmoid(self.skip).index_select(0, self.node_type).unsqueeze(1)
            out = gate * out + (1 - gate) * x
        return out
