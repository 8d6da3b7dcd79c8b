"""Derived weights (linear operator reordering), computed with torch in every backend.

A :class:`~rgtune.ir.kernels.WeightKernel` folds weights by associativity once per call (the math:
:func:`rgtune.ir.folds.fold`), differentiable, so training through a reordered layer updates the
original parameters.
"""

from __future__ import annotations

from typing import Mapping

import torch

from rgtune.ir.bind import GraphArrays
from rgtune.ir.folds import fold
from rgtune.ir.kernels import WeightKernel


def fold_weights(k: WeightKernel, params: Mapping[str, torch.Tensor], arrays: GraphArrays,
                 param_shapes: Mapping[str, tuple[int, ...]]) -> torch.Tensor:
    """The full tensor of derived param ``k.out`` (one slice per relation)."""
    end_ntype = None
    if k.mode in ("compose", "compose_bias"):
        end_ntype = (arrays.rel_src_ntype if k.end == "src" else arrays.rel_dst_ntype).long()
    return fold(k.mode, params[k.a], params[k.b] if k.b else None, end_ntype, param_shapes.get(k.out))
