"""What the tests of the drop-in modules (rgtune.nn.pyg, rgtune.nn.dgl) share."""

from __future__ import annotations

from typing import Any, Callable

import torch


def assert_same_as_library(theirs: torch.nn.Module, ours: torch.nn.Module, run_theirs: Callable[[Any], Any],
                           run_ours: Callable[[Any], Any], x: torch.Tensor) -> torch.Tensor:
    """The library's module and ours, with the same parameters, give the same output for ``x``, and for one
    random output gradient the same gradient of ``x`` and of every parameter (by the library's names).
    Returns the library's output."""
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = run_theirs(xa), run_ours(xb)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)
    grad = torch.randn_like(want)
    want.backward(grad)
    got.backward(grad)
    assert torch.allclose(xb.grad, xa.grad, rtol=1e-4, atol=1e-5)
    mine = dict(ours.named_parameters())
    for name, p in theirs.named_parameters():
        if p.grad is None:  # a parameter the library keeps for another mode (PyG's RGATConv): unused by both
            assert mine[name].grad is None, name
            continue
        assert torch.allclose(mine[name].grad, p.grad, rtol=1e-4, atol=1e-5), name
    return want.detach()
