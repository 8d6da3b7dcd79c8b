"""PyG's ``RGATConv`` on generated kernels."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from rgtune.data.graph import HeteroGraph
from rgtune.nn._inputs import edge_list
from rgtune.nn.pyg._edge_type import _EdgeTypeConv

__all__ = ["RGATConv"]


#: PyG's ``attention_mechanism`` of ``RGATConv`` -> rgtune's RGAT option ``softmax``
_RGAT_SOFTMAX = {"across-relation": "destination", "within-relation": "relation"}
#: PyG's ``attention_mode`` -> rgtune's RGAT option ``score``
_RGAT_SCORE = {"additive-self-attention": "additive", "multiplicative-self-attention": "multiplicative"}
_MODS = (None, "additive", "scaled", "f-additive", "f-scaled")


class RGATConv(_EdgeTypeConv):
    r"""PyG's ``RGATConv``: per edge :math:`j \to i` of relation ``r``, :math:`z = x W_r`, the score
    :math:`\mathrm{LeakyReLU}(z_i q + z_j k)` (``additive-self-attention``) or :math:`(z_i q) (z_j k)`
    (``multiplicative-self-attention``), :math:`\alpha_{ij}` its softmax over ``i``'s in-edges
    (``across-relation``) or those of ``r`` (``within-relation``), :math:`x'_i = \sum_j \alpha_{ij} z_j + b`,
    with PyG's ``mod`` variants (``additive``, ``scaled``, ``f-additive``, ``f-scaled``) of the message.

    With ``heads`` heads, :math:`z` has ``heads * out`` features and every head's score reads all of them
    (``q``, ``k``: ``(heads * out, heads)``); the heads are concatenated, or averaged with ``concat=False``.
    ``W_r`` is ``weight[r]``, or PyG's decompositions: ``num_bases`` (``basis``, ``att``), ``num_blocks``
    (a block-diagonal ``weight``). Its parameters are PyG's own (made by PyG's constructor, so a state dict
    moves both ways); the kernels run rgtune's RGAT (:func:`rgtune.ir.models.rgat`, ``attention="mixed"``)
    on them as they are, and the bias is added after the kernels (after the heads' mean), as PyG adds it.
    Args (PyG's): in_channels, out_channels, num_relations, num_bases, num_blocks, mod, attention_mechanism,
    attention_mode, heads, dim (1), concat, negative_slope (0.2), dropout (0), edge_dim (None), bias.
    Keyword-only (rgtune's): backend, db, mode.
    """

    model = "rgat"

    def __init__(self, in_channels: int, out_channels: int, num_relations: int, num_bases: int | None = None,
                 num_blocks: int | None = None, mod: str | None = None,
                 attention_mechanism: str = "across-relation", attention_mode: str = "additive-self-attention",
                 heads: int = 1, dim: int = 1, concat: bool = True, negative_slope: float = 0.2,
                 dropout: float = 0.0, edge_dim: int | None = None, bias: bool = True, *, backend: str = "auto",
                 db: Any = "results.db", mode: str = "training") -> None:
        super().__init__()
        name = type(self).__name__
        if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
            raise ValueError(f"{name}: heads={heads!r}; a positive int")
        if attention_mechanism not in _RGAT_SOFTMAX:
            raise ValueError(f"{name}: attention_mechanism={attention_mechanism!r}; choose one of {list(_RGAT_SOFTMAX)}")
        if attention_mode not in _RGAT_SCORE:
            raise ValueError(f"{name}: attention_mode={attention_mode!r}; choose one of {list(_RGAT_SCORE)}")
        if mod not in _MODS:
            raise ValueError(f"{name}: mod={mod!r}; choose one of {list(_MODS)}")
        if not isinstance(in_channels, int) or isinstance(in_channels, bool) or in_channels < 1:
            raise ValueError(f"{name}: in_channels={in_channels!r}: node features of one size (an int)")
        from torch_geometric.nn import RGATConv as PyGRGATConv  # PyG's parameters, by PyG's own constructor

        # PyG's own checks (dim with the additive mode, dropout with a mod, bases with blocks) and parameters
        pyg = PyGRGATConv(in_channels, out_channels, num_relations, num_bases=num_bases, num_blocks=num_blocks,
                          mod=mod, attention_mechanism=attention_mechanism, attention_mode=attention_mode,
                          heads=heads, dim=dim, concat=concat, negative_slope=negative_slope, dropout=dropout,
                          edge_dim=edge_dim, bias=bias)
        given = {"dim": dim, "negative_slope": negative_slope, "dropout": dropout, "edge_dim": edge_dim}
        supported = {"dim": 1, "negative_slope": 0.2, "dropout": 0.0, "edge_dim": None}
        for what, value in given.items():
            if value != supported[what]:
                raise ValueError(f"{name}: {what}={value!r} is not supported; rgtune's RGAT computes "
                                 f"{what}={supported[what]!r}")
        for pname, param in pyg.named_parameters(recurse=False):
            self.register_parameter(pname, param)
        for child, module in pyg.named_children():
            self.add_module(child, module)
        self.in_channels, self.out_channels, self.num_relations = in_channels, out_channels, num_relations
        self.num_bases, self.num_blocks, self.mod = num_bases, num_blocks, mod
        self.attention_mechanism, self.attention_mode = attention_mechanism, attention_mode
        self.heads, self.dim, self.concat = heads, dim, concat
        self.negative_slope, self.dropout, self.edge_dim = negative_slope, dropout, edge_dim
        options: dict[str, Any] = {"softmax": _RGAT_SOFTMAX[attention_mechanism], "attention": "mixed",
                                   "score": _RGAT_SCORE[attention_mode]}
        options.update({k: v for k, v in (("num_bases", num_bases), ("num_blocks", num_blocks), ("mod", mod))
                        if v is not None})
        self._setup(in_channels, heads * out_channels, heads, options, backend, db, mode)

    def forward(self, x: Tensor | None, edge_index: Any, edge_type: Tensor | None = None,
                edge_attr: Tensor | None = None, size: Any = None, return_attention_weights: bool | None = None
                ) -> Any:
        """PyG's call: ``x`` ``(num_nodes, in_channels)``; ``edge_index`` ``(2, num_edges)`` or a transposed
        sparse adjacency (whose values are ``edge_type`` where that is not given); ``edge_type``
        ``(num_edges,)``. Returns ``(num_nodes, heads * out_channels)`` (``out_channels`` with ``concat=False``)."""
        name = type(self).__name__
        edges = edge_list(edge_index, "edge_index")
        if edge_type is None and edges.values is not None and not edges.values.is_floating_point():
            edge_type = edges.values  # PyG reads an adjacency's values as the edge types where none are given
        if edge_attr is None and edges.values is not None and edges.values.is_floating_point():
            edge_attr = edges.values  # ... and as the edge features
        if edge_attr is not None:
            raise ValueError(f"{name}: edge_attr is not supported (it needs edge_dim, which rgtune's RGAT does "
                             "not compute); call without edge_attr")
        if return_attention_weights is not None:
            raise ValueError(f"{name}: return_attention_weights is not supported yet; call without it")
        if size is not None and (isinstance(x, Tensor) and tuple(size) != (x.size(0), x.size(0))):
            raise ValueError(f"{name}: size={size!r}: one node set (num_nodes, num_nodes) is supported")
        out = super().forward(x, edges.edge_index, edge_type)
        if not self.concat:  # PyG averages the heads
            out = out.view(out.size(0), self.heads, self.out_channels).mean(dim=1)
        bias = self._parameters.get("bias")
        return out if bias is None else out + bias  # PyG adds it after the aggregation

    def _rgtune_params(self, graph: HeteroGraph) -> dict[str, Tensor]:
        """PyG's own: ``weight`` (or ``basis`` and ``att``), ``q`` and ``k`` ``(heads * out, heads)`` (rgtune's
        ``attn_dst`` and ``attn_src``, shared by the relations as in PyG), and the ``mod``'s: ``w`` ``(out,)``,
        ``l1`` ``(1, out)``, ``b1`` ``(1, out)``, ``l2`` ``(out, out)``, ``b2`` ``(1, out)``, reshaped to the
        program's ``(1, out)`` rows and ``(out,)`` biases."""
        params = {"attn_dst": self.q, "attn_src": self.k}
        if self.num_bases is not None:
            params.update(basis=self.basis, att=self.att)
        else:
            params["weight"] = self.weight
        if self.mod == "additive":
            params["w"] = self.w.view(1, -1)
        elif self.mod == "scaled":
            params.update(l1=self.l1, b1=self.b1.view(-1), l2=self.l2, b2=self.b2.view(-1))
        return params

    def __repr__(self) -> str:  # PyG's
        return f"{type(self).__name__}({self.in_channels}, {self.out_channels}, heads={self.heads})"
