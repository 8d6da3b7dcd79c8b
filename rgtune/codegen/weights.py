"""Derived weights (linear operator reordering), computed with torch in every backend.

A :class:`~rgtune.ir.kernels.WeightKernel` folds weights by associativity once per call:
``O(R * Din * H * D * D)`` work on weights alone, independent of the graph's size, and
differentiable, so training through a reordered layer updates the original parameters.
"""

from __future__ import annotations

from typing import Mapping

import torch

from rgtune.ir.bind import GraphArrays
from rgtune.ir.kernels import WeightKernel


def fold_weights(k: WeightKernel, params: Mapping[str, torch.Tensor], arrays: GraphArrays,
                 param_shapes: Mapping[str, tuple[int, ...]]) -> torch.Tensor:
    """The full tensor of derived param ``k.out`` (one slice per relation)."""
    if k.mode == "transpose":  # (R, H, D, D) -> per-head transpose
        return params[k.a].transpose(-1, -2).contiguous()
    if k.mode == "split_heads":  # (R, Din, H*D) -> (R, H, Din, D)
        w = params[k.a]
        heads, din, d = param_shapes[k.out]
        return w.reshape(w.shape[0], din, heads, d).permute(0, 2, 1, 3).contiguous()
    if k.mode == "vec":  # (R, Din, H*D) . (R, H, D) -> (R, Din, H)
        w, vec = params[k.a], params[k.b]  # type: ignore[index]
        r, din, _ = w.shape
        return torch.einsum("rihd,rhd->rih", w.reshape(r, din, vec.shape[1], vec.shape[2]), vec).contiguous()
    end_ntype = (arrays.rel_src_ntype if k.end == "src" else arrays.rel_dst_ntype).long()
    b = params[k.b]  # type: ignore[index]  # (R, H, D, D)
    r, h, d, _ = b.shape
    if k.mode == "compose":  # A[ntype at the end of r] (Din, H*D), then per-head B[r]
        wa = params[k.a][end_ntype]
        return torch.einsum("rihd,rhde->rihe", wa.reshape(r, -1, h, d), b).reshape(r, -1, h * d).contiguous()
    if k.mode == "compose_bias":
        ba = params[k.a][end_ntype]
        return torch.einsum("rhd,rhde->rhe", ba.reshape(r, h, d), b).reshape(r, h * d).contiguous()
    raise ValueError(f"unknown weight fold mode {k.mode!r}; known: transpose, split_heads, vec, compose, compose_bias")
