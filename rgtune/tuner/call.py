"""The layer as a user calls it: a trial's schedule in a :class:`~rgtune.runtime.module.Layer`, checked and timed.

The kernels a trial times are not all a user's call runs: ``layer(x)`` also checks its arguments, goes
through the autograd Function, allocates its results and, on a GPU, replays the program as a CUDA graph
(copying the input in and the output out); ``loss.backward()`` runs the backward phase on what the
forward saved, not the training step the tuner verifies in one go. On a GPU those costs were most of
a small graph's call (measured on an H200: RGAT on AIFB, 0.093 ms of kernels, 0.98 ms as called). So a
trial also builds the layer for its schedule and calls it as a user would:

* inference: ``layer(x)`` under ``torch.no_grad()`` (the inference program);
* training: ``out = layer(x)`` with ``x`` and every parameter needing gradients, then
  ``out.backward(dout)`` (Hector's protocol: the forward and the backward to the input and every
  parameter; the gradients set to None between steps, as ``zero_grad()`` does).

A call is verified before it is timed, on the trial's own case (the layer's parameters are the case's),
against the same float64 reference as the kernels: a call that computes something else than its kernels
(a phase's buffers mixed up, a replay of stale inputs) is ``wrong_result``, never timed. The time of a run
is the host's clock around the call and a synchronization, as a user's loop sees it.

Example:
    >>> import torch
    >>> from rgtune.codegen.base import create
    >>> from rgtune.data.synthetic import random_graph
    >>> from rgtune.ir.registry import build_model
    >>> g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    >>> call = LayerCall(build_model("rgcn", 4, 8, 1, {}), g, {}, create("reference"), "training")
    >>> x, dout = torch.randn(30, 4), torch.randn(30, 8)
    >>> got = call.results(x, {}, dout)          # the layer's own parameters: none given
    >>> sorted(got)
    ['gradient of bias', 'gradient of root', 'gradient of weight', 'input gradient', 'output']
    >>> call.run(x, dout)                        # one timed run: forward and backward
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from rgtune.codegen.base import Backend
from rgtune.data.graph import HeteroGraph
from rgtune.ir.program import EDGE_WEIGHT, Program
from rgtune.runtime.module import Layer

__all__ = ["LayerCall"]


class LayerCall:
    """A schedule as a user calls it: ``program`` compiled with ``config`` into a layer on ``backend``
    bound to ``graph``, in ``mode`` (``"inference"``: a forward without gradients; ``"training"``: a
    forward and a backward). Compiling again is a kernel-cache hit: the trial compiled the same sources."""

    def __init__(self, program: Program, graph: HeteroGraph, config: Mapping[str, Any], backend: Backend,
                 mode: str) -> None:
        self.training = mode == "training"
        self.backend = backend
        self.layer = Layer(program, graph, config=config, backend=backend, mode=mode, device=backend.device_type)
        self._params = dict(self.layer.named_parameters())
        self._kw: dict[str, torch.Tensor] = {}  # a program that reads the caller's edge weight: edge_weight=...

    def use_params(self, params: Mapping[str, torch.Tensor]) -> None:
        """Copy ``params`` (by name, on the layer's device) into the layer's parameters."""
        if EDGE_WEIGHT in params:  # the caller's per-edge weight: given with every call, as a user gives it
            self._kw = {"edge_weight": params[EDGE_WEIGHT].to(self.backend.device_type, torch.float32)}
        with torch.no_grad():
            for name, value in params.items():
                mine = self._params.get(name)
                if mine is not None:
                    mine.copy_(value)

    def run(self, x: torch.Tensor, dout: torch.Tensor | None = None) -> None:
        """One call, as the user's loop makes it, and a synchronization (what a timed run is)."""
        if self.training:
            self._step(x, dout)
        else:
            with torch.no_grad():
                self.layer(x, **self._kw)
        self.backend.synchronize()

    def results(self, x: torch.Tensor, params: Mapping[str, torch.Tensor],
                dout: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """What one call computes with ``params``, named as the verifier names results: ``output``, and in
        training ``input gradient`` and ``gradient of P`` for every parameter given one."""
        self.use_params(params)
        if not self.training:
            with torch.no_grad():
                return {"output": self.layer(x, **self._kw)}
        out, leaf = self._step(x, dout)
        got = {"output": out.detach(), "input gradient": leaf.grad}
        got.update({f"gradient of {n}": p.grad for n, p in self._params.items() if p.grad is not None})
        return got

    def _step(self, x: torch.Tensor, dout: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """A training step's forward and backward; the output and the input leaf (their gradients set)."""
        assert dout is not None, "a training call needs the output's gradient"
        for p in self._params.values():
            p.grad = None
        leaf = x.detach().requires_grad_(True)
        out = self.layer(leaf, **self._kw)
        out.backward(dout)
        return out, leaf
