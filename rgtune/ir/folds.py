"""The math of derived weights (linear operator reordering), on whole param tensors, in torch.

A :class:`~rgtune.ir.program.FoldWeights` op (and the :class:`~rgtune.ir.kernels.WeightKernel` it
lowers to) derives a weight by associativity once per call: ``O(R * Din * H * D * D)`` work on
weights alone, independent of the graph's size. The same function serves every executor of the IR
(the interpreter, the reference executor, the generated backends' host code); it is made of
differentiable torch ops, so training through a reordered layer updates the original parameters
(the gradient of a derived weight flows to its sources by torch's autograd).

Example:
    >>> import torch
    >>> w = torch.arange(6.).reshape(1, 2, 3)
    >>> fold("transpose", w).shape
    torch.Size([1, 3, 2])
"""

from __future__ import annotations

import torch

__all__ = ["fold", "FOLD_MODES"]

FOLD_MODES = ("transpose", "split_heads", "vec", "compose", "compose_bias", "bases", "join_heads")


def fold(mode: str, a: torch.Tensor, b: torch.Tensor | None = None, end_ntype: torch.Tensor | None = None,
         out_slice: tuple[int, ...] | None = None) -> torch.Tensor:
    """The full tensor of a derived param from the full tensors ``a`` (and ``b``).

    ``end_ntype``: the node type at the folded end of each relation (``compose``, ``compose_bias``);
    ``out_slice``: the derived param's slice shape (``split_heads``).
    """
    if mode == "transpose":  # the last two dims: (T, H, D, E) -> (T, H, E, D), (T, I, O) -> (T, O, I), (I, O) -> (O, I)
        return a.transpose(-1, -2).contiguous()
    if mode == "split_heads":  # (R, Din, H*D) -> (R, H, Din, D)
        assert out_slice is not None
        heads, din, d = out_slice
        return a.reshape(a.shape[0], din, heads, d).permute(0, 2, 1, 3).contiguous()
    if mode == "bases":  # bases V (B, Din, Dout), coefficients (R, B) -> (R, Din, Dout): W[r] = sum_b comp[r, b] V[b]
        assert b is not None
        return (b @ a.reshape(a.shape[0], -1)).reshape(b.shape[0], *a.shape[1:])
    if mode == "join_heads":  # (..., H, Din, D) -> (..., Din, H*D): column block h is slice h
        *lead, heads, din, d = a.shape
        return a.movedim(-3, -2).reshape(*lead, din, heads * d).contiguous()
    if mode == "vec":  # (R, Din, H*D) . (R, H, D) -> (R, Din, H)
        assert b is not None
        r, din, _ = a.shape
        return torch.einsum("rihd,rhd->rih", a.reshape(r, din, b.shape[1], b.shape[2]), b).contiguous()
    if mode in ("compose", "compose_bias"):
        assert b is not None and end_ntype is not None
        r, h, d, _ = b.shape  # (R, H, D, D)
        if mode == "compose":  # A[ntype at the end of r] (Din, H*D), then per-head B[r]
            wa = a[end_ntype]
            return torch.einsum("rihd,rhde->rihe", wa.reshape(r, -1, h, d), b).reshape(r, -1, h * d).contiguous()
        ba = a[end_ntype]
        return torch.einsum("rhd,rhde->rhe", ba.reshape(r, h, d), b).reshape(r, h * d).contiguous()
    raise ValueError(f"unknown weight fold mode {mode!r}; known: {', '.join(FOLD_MODES)}")
