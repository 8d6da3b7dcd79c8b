"""One training step of a built training program: the output, the input's gradient, every learnable param's.

A training kernel program (:attr:`KernelProgram.is_training`) computes the gradients of the params its
kernels read, derived weights included (the compositions of linear operator reordering, the transposes
the backward reads). A derived weight is computed from learnable ones with torch once per call
(:mod:`rgtune.codegen.weights`); :func:`train_step` computes those folds again with autograd and sends
the derived weights' gradients back through them, so the result is one gradient per learnable param,
what ``torch.autograd`` of the layer gives.

Example:
    >>> import torch
    >>> from rgtune.codegen.base import create
    >>> from rgtune.codegen.reference import init_params
    >>> from rgtune.data.synthetic import random_graph
    >>> from rgtune.ir.models import build_model
    >>> from rgtune.search_spaces import SearchSpace
    >>> g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    >>> space = SearchSpace(build_model("hgt", 8, 8, 2), g, "cpu", mode="training")
    >>> point = space.compile({**space.default(), "reorder.compose": "on"})
    >>> built = create("reference").build(point.kernels, g, point.config)
    >>> params = init_params(point.kernels, g, dtype=torch.float64)
    >>> out, dx, grads = train_step(built, point.kernels, g, torch.randn(30, 8, dtype=torch.float64), params,
    ...                             torch.randn(30, 8, dtype=torch.float64))
    >>> sorted(grads) == sorted(params)   # no derived weight among them: they went back through the folds
    True
"""

from __future__ import annotations

from typing import Mapping

import torch

from rgtune.codegen.base import BuiltProgram, TrainingResult
from rgtune.codegen.weights import fold_weights
from rgtune.data.graph import HeteroGraph
from rgtune.ir.bind import graph_arrays
from rgtune.ir.kernels import KernelProgram, WeightKernel

__all__ = ["train_step", "learnable_grads", "gradient_receivers"]


def train_step(built: BuiltProgram, kp: KernelProgram, graph: HeteroGraph, x: torch.Tensor,
               params: Mapping[str, torch.Tensor], dout: torch.Tensor) -> TrainingResult:
    """``(output, input gradient, {learnable param: gradient})`` of one step (see the module docstring)."""
    out, dx, grads = built.run_training(x, params, dout)
    return out, dx, learnable_grads(kp, graph, params, grads)


def gradient_receivers(kp: KernelProgram) -> set[str]:
    """The params (learnable and derived) that get a gradient: those the training program computes one
    for, and what the folds of those that are derived weights read (a learnable param outside this set
    gets None, as autograd gives an unused one)."""
    have = set(kp.param_grads)
    for k in reversed(kp.kernels):  # a fold may read an earlier fold's output
        if isinstance(k, WeightKernel) and k.out in have:
            have.update(n for n in (k.a, k.b) if n)
    return have


def learnable_grads(kp: KernelProgram, graph: HeteroGraph, params: Mapping[str, torch.Tensor],
                    grads: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every learnable param's gradient: its own (``grads``), plus what the derived weights' gradients send
    back through the folds that computed them from ``params``."""
    own = {k: g for k, g in grads.items() if k in params}
    derived = {k: g for k, g in grads.items() if k not in params}
    if not derived:
        return own
    arrays = graph_arrays(graph, kp.layout, kp.index_bits).to(next(iter(params.values())).device)
    receivers = gradient_receivers(kp)
    names = [k for k in params if k in receivers]  # the params that a derived weight's gradient reaches

    def folds(*learnable: torch.Tensor) -> list[torch.Tensor]:
        folded: dict[str, torch.Tensor] = {**params, **dict(zip(names, learnable))}
        for k in kp.kernels:  # in program order: a fold may read an earlier fold's output
            if isinstance(k, WeightKernel) and k.out not in folded:
                folded[k.out] = fold_weights(k, folded, arrays, kp.param_shapes)
        missing = sorted(set(derived) - set(folded))
        if missing:
            raise KeyError(f"gradients of {missing}, which are neither params nor derived weights of {kp.name}")
        return [folded[k] for k in derived]

    # torch.func rather than the autograd engine: this also runs inside the layer's custom op (under
    # torch.compile), where autograd does not record
    folded, vjp = torch.func.vjp(folds, *(params[k].detach() for k in names))
    back = vjp([derived[k].to(f.dtype) for k, f in zip(derived, folded)])
    for name, g in zip(names, back):
        if g is not None:
            own[name] = own[name] + g.to(own[name].dtype) if name in own else g
    return own
