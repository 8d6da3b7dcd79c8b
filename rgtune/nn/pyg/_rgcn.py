"""PyG's ``RGCNConv`` on generated kernels."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rgtune.data.graph import HeteroGraph
from rgtune.ir.registry import model_spec
from rgtune.runtime.module import init_param
from rgtune.nn.pyg._edge_type import _EdgeTypeConv

__all__ = ["RGCNConv"]


#: PyG's ``aggr`` of ``RGCNConv`` -> rgtune's RGCN option ``aggr``
_AGGRS = {"mean": "mean", "add": "sum", "sum": "sum"}


class RGCNConv(_EdgeTypeConv):
    r"""PyG's ``RGCNConv``: :math:`x'_i = x_i \Theta_{root} + b + \sum_r \frac{1}{|N_r(i)|}
    \sum_{j \in N_r(i)} x_j \Theta_r`, with ``num_bases`` (:math:`\Theta_r = \sum_b a_{rb} V_b`) or
    ``num_blocks`` (block-diagonal :math:`\Theta_r`), on generated kernels (see the module docstring).

    Args (PyG's):
        in_channels, out_channels: feature sizes (``in_channels`` an int: node features, not PyG's
            featureless ``x=None`` form, nor a bipartite tuple).
        num_relations: edge types ``0 .. num_relations - 1``.
        num_bases, num_blocks: the weight decompositions (at most one).
        aggr: ``"mean"`` (PyG's default) or ``"add"`` (the sum over each relation's in-neighbours).
        root_weight, bias: both ``True`` (PyG's defaults; rgtune's RGCN has both).
        is_sorted: accepted and ignored (edges are grouped by relation when the graph is built).

    Keyword-only (rgtune's):
        backend: ``"auto"`` (the kernels of the device the input is on: ``cuda`` or ``cpu``) or a name.
        db: the trial database the schedule is looked up in (None: the default schedule).
        mode: the schedule looked up: ``"training"`` (a training step's, default) or ``"inference"``.
    """

    model = "rgcn"

    def __init__(self, in_channels: int, out_channels: int, num_relations: int, num_bases: int | None = None,
                 num_blocks: int | None = None, aggr: str = "mean", root_weight: bool = True, is_sorted: bool = False,
                 bias: bool = True, *, backend: str = "auto", db: Any = "results.db", mode: str = "training") -> None:
        super().__init__()
        name = type(self).__name__
        if not isinstance(in_channels, int) or isinstance(in_channels, bool):
            raise ValueError(f"{name}: in_channels={in_channels!r}: rgtune's RGCNConv takes node features of one size "
                             "(an int); PyG's featureless (x=None) and bipartite (a tuple) forms are not supported")
        if aggr not in _AGGRS:
            raise ValueError(f"{name}: aggr={aggr!r} is not supported; rgtune's RGCN takes the mean (PyG's default, "
                             "aggr='mean') or the sum (aggr='add') over each relation's in-neighbours")
        for flag, value in (("root_weight", root_weight), ("bias", bias)):
            if not value:
                raise ValueError(f"{name}: {flag}=False is not supported; rgtune's RGCN has the root weight and the "
                                 f"bias (PyG's defaults, {flag}=True)")
        if isinstance(num_relations, bool) or not isinstance(num_relations, int) or num_relations < 1:
            raise ValueError(f"{name}: num_relations must be a positive int, got {num_relations!r}")
        self.in_channels, self.out_channels, self.num_relations = in_channels, out_channels, num_relations
        self.num_bases, self.num_blocks = num_bases, num_blocks
        self.aggr = aggr
        self.options = {k: v for k, v in (("num_bases", num_bases), ("num_blocks", num_blocks),
                                          ("aggr", None if _AGGRS[aggr] == "mean" else _AGGRS[aggr])) if v is not None}
        spec = model_spec(self.model)
        try:
            self._program = spec.build(in_channels, out_channels, 1, spec.resolve(self.options))
        except ValueError as e:  # a bad decomposition for these sizes, said by the model's builder
            raise ValueError(f"{name}: {e}") from None
        self._setup(in_channels, out_channels, 1, self.options, backend, db, mode)
        for pname, p in self._program.state_params().items():
            count = num_relations if p.by == "rel" else None
            self.register_parameter(pname, init_param(p, count, dtype=torch.float32, device=None))

    def reset_parameters(self) -> None:
        """Fresh parameters, initialized as PyG initializes them (glorot weights, zero bias)."""
        for pname, p in self._program.state_params().items():
            mine = getattr(self, pname)
            count = self.num_relations if p.by == "rel" else None
            with torch.no_grad():
                mine.copy_(init_param(p, count, dtype=mine.dtype, device=mine.device))

    def _rgtune_params(self, graph: HeteroGraph) -> dict[str, Tensor]:
        """PyG's parameters are rgtune's RGCN weights as they are (the same names and shapes)."""
        return {pname: getattr(self, pname) for pname in self._program.state_params()}

    def extra_repr(self) -> str:
        opts = "".join(f", {k}={v}" for k, v in self.options.items())
        return f"{self.in_channels}, {self.out_channels}, num_relations={self.num_relations}{opts}"
