"""PyG's ``RGATConv`` on generated kernels."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from rgtune.data.graph import HeteroGraph
from rgtune.nn.pyg._edge_type import _EdgeTypeConv

__all__ = ["RGATConv"]


#: PyG's ``attention_mechanism`` of ``RGATConv`` -> rgtune's RGAT option ``softmax``
_RGAT_SOFTMAX = {"across-relation": "destination", "within-relation": "relation"}


class RGATConv(_EdgeTypeConv):
    r"""PyG's ``RGATConv`` (additive self-attention): per edge :math:`j \to i` of relation ``r``,
    :math:`z = x W_r`, :math:`\alpha_{ij} = \mathrm{softmax}(\mathrm{LeakyReLU}(z_i q + z_j k))` over ``i``'s
    in-edges (``across-relation``) or those of ``r`` (``within-relation``), :math:`x'_i = \sum_j \alpha_{ij} z_j + b`.

    With ``heads`` heads, :math:`z` has ``heads * out`` features and every head's score reads all of them
    (``q``, ``k``: ``(heads * out, heads)``); the heads are concatenated, or averaged with ``concat=False``.
    Its parameters are PyG's own (``weight``, ``q``, ``k``, ``bias``, and the ones PyG keeps for its other
    attention modes); the kernels run rgtune's RGAT with ``attention="mixed"`` on ``weight``, ``q`` and ``k``
    as they are (shared by the relations, as in PyG), and the bias is added after the kernels (after the
    heads' mean), as PyG adds it. Args (PyG's): in_channels, out_channels, num_relations, heads,
    attention_mechanism, attention_mode (``"additive-self-attention"``), concat, negative_slope (0.2), bias;
    the others at PyG's defaults. Keyword-only (rgtune's): backend, db, mode.
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
        given = {"num_bases": num_bases, "num_blocks": num_blocks, "mod": mod, "attention_mode": attention_mode,
                 "dim": dim, "negative_slope": negative_slope, "dropout": dropout, "edge_dim": edge_dim}
        supported = {"num_bases": None, "num_blocks": None, "mod": None, "attention_mode": "additive-self-attention",
                     "dim": 1, "negative_slope": 0.2, "dropout": 0.0, "edge_dim": None}
        for what, value in given.items():
            if value != supported[what]:
                raise ValueError(f"{name}: {what}={value!r} is not supported; rgtune's RGAT computes "
                                 f"{what}={supported[what]!r}")
        if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
            raise ValueError(f"{name}: heads={heads!r}; a positive int")
        if attention_mechanism not in _RGAT_SOFTMAX:
            raise ValueError(f"{name}: attention_mechanism={attention_mechanism!r}; choose one of {list(_RGAT_SOFTMAX)}")
        if not isinstance(in_channels, int) or isinstance(in_channels, bool) or in_channels < 1:
            raise ValueError(f"{name}: in_channels={in_channels!r}: node features of one size (an int)")
        from torch_geometric.nn import RGATConv as PyGRGATConv  # PyG's parameters, by PyG's own constructor

        pyg = PyGRGATConv(in_channels, out_channels, num_relations, attention_mechanism=attention_mechanism,
                          heads=heads, concat=concat, bias=bias)
        for pname, param in pyg.named_parameters(recurse=False):
            self.register_parameter(pname, param)
        for child, module in pyg.named_children():
            self.add_module(child, module)
        self.in_channels, self.out_channels, self.num_relations = in_channels, out_channels, num_relations
        self.attention_mechanism, self.heads, self.concat = attention_mechanism, heads, concat
        options = {"softmax": _RGAT_SOFTMAX[attention_mechanism], "attention": "mixed"}
        self._setup(in_channels, heads * out_channels, heads, options, backend, db, mode)

    def forward(self, x: Tensor | None, edge_index: Tensor, edge_type: Tensor | None = None) -> Tensor:
        out = super().forward(x, edge_index, edge_type)
        if not self.concat:  # PyG averages the heads
            out = out.view(out.size(0), self.heads, self.out_channels).mean(dim=1)
        bias = self._parameters.get("bias")
        return out if bias is None else out + bias  # PyG adds it after the aggregation

    def _rgtune_params(self, graph: HeteroGraph) -> dict[str, Tensor]:
        """PyG's own: ``weight`` ``(R, in, heads * out)``, and ``q`` and ``k`` ``(heads * out, heads)``, rgtune's RGAT
        (``attention="mixed"``) ``attn_dst`` and ``attn_src``, shared by the relations as in PyG."""
        return {"weight": self.weight, "attn_dst": self.q, "attn_src": self.k}

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, num_relations={self.num_relations}, heads={self.heads}, "
                f"attention_mechanism={self.attention_mechanism!r}")
