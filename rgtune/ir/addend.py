"""Accumulating into the addend: ``out = a + b``, where a kernel accumulates ``b``, becomes that kernel
accumulating into ``a``.

A layer's last step is often a sum of two node values: RGCN's self-loop ``x W_0 + b`` plus its
relations' messages; its training step's input gradient is the same kind of sum. When one term
arrives by accumulation (an aggregation over in-edges, a scatter into sources, pair rows summed into
their nodes by a GEMM), lowering gives three node buffers and a map: ``a``, ``b`` (zeroed, then added
into) and ``out = a + b``. The accumulating kernel can add into ``a`` instead: ``a`` is the result,
and neither ``b`` nor the map exists. That saves two node buffers per sum (about 1 GB on ogbn-mag at
64 features) and a pass over three of them, on every backend (each one's aggregations, scatters and
accumulating GEMMs add into their output, none stores), with the same sums in another order (float32
rounding aside).

It applies when nothing else can tell: the map writes the program's output (or input gradient) and
nobody reads that; ``a`` is written by one kernel before the accumulating one and read only by the
map; ``b`` is written only by the accumulating kernel (zeroed first) and read only by the map. So a
training program's saved values (read by its backward) never move.

Example:
    >>> from rgtune.data.synthetic import random_graph
    >>> from rgtune.ir.pipeline import compile_program
    >>> from rgtune.ir.registry import build_model
    >>> g = random_graph((50, 50), num_relations=2, num_edges=300, seed=0)
    >>> kp = compile_program(build_model("rgcn", 8, 8), {"reorder.aggregate_first": "on"}, g).kernels
    >>> [(k.name, *k.writes()) for k in kp.kernels], kp.output
    ([('gemm1', 'v4'), ('aggregate1', 'v6'), ('gemm2', 'v4')], 'v4')
"""

from __future__ import annotations

import dataclasses

from rgtune.ir.kernels import (NODE_ROWS, AggregateStage, BinaryE, GemmKernel, Kernel, KernelProgram, Load, MapKernel,
                               ScatterKernel, SoftmaxAggregate, TraversalKernel)

__all__ = ["accumulate_into_addends"]


def accumulate_into_addends(kp: KernelProgram) -> KernelProgram:
    """``kp`` with its final sums folded into the kernels that accumulate one of their terms: the output's
    and a training program's input gradient's (see the module docstring); ``kp`` itself where the form is
    absent."""
    for target in ("output", "input_grad"):
        name = getattr(kp, target)
        found = _fold(kp, name) if name is not None else None
        if found is None:
            continue
        m, w, a, b = found
        kernels = [_writing(k, b, a) if i == w else k for i, k in enumerate(kp.kernels) if i != m]
        forward = kp.forward_kernels
        if forward is not None and m < forward:
            forward -= 1
        kp = dataclasses.replace(kp, kernels=kernels, buffers={n: v for n, v in kp.buffers.items() if n not in (b, name)},
                                 zero_init=kp.zero_init - {b}, forward_kernels=forward, **{target: a})
    return kp


def _accumulates(k: Kernel) -> str | None:
    """The buffer ``k`` adds into (every backend adds, none stores), or None: an accumulating GEMM without
    an epilogue, an aggregation (softmax-weighted or not) or a scatter."""
    if isinstance(k, GemmKernel):
        return k.out if k.accumulate and not k.epilogue else None
    if isinstance(k, ScatterKernel):
        return k.out
    if isinstance(k, TraversalKernel) and isinstance(k.stage, (AggregateStage, SoftmaxAggregate)):
        return k.stage.out
    return None


def _writing(k: Kernel, old: str, new: str) -> Kernel:
    """``k`` adding into ``new`` instead of ``old``."""
    if isinstance(k, TraversalKernel):
        return dataclasses.replace(k, stage=dataclasses.replace(k.stage, out=new))
    assert getattr(k, "out", None) == old
    return dataclasses.replace(k, out=new)


def _fold(kp: KernelProgram, out: str) -> tuple[int, int, str, str] | None:
    """``(map index, accumulating kernel's index, a, b)`` of the form ``out = a + b``, or None."""
    readers, writers = _touching(kp.kernels)
    mine = writers.get(out, [])
    if len(mine) != 1 or readers.get(out):
        return None
    m = mine[0]
    k = kp.kernels[m]
    if not (isinstance(k, MapKernel) and k.rows in NODE_ROWS and isinstance(k.value, BinaryE) and k.value.op == "add"):
        return None
    loads = (k.value.a, k.value.b)
    if not all(isinstance(v, Load) and v.via == "row" and not v.guard for v in loads):
        return None
    names = [v.buffer for v in loads]  # type: ignore[union-attr]
    keep = {kp.input, kp.dout, kp.output, kp.input_grad}
    # one shape for all (a view reads a buffer with other heads; a per-head GEMM writes its own), and one
    # row domain (every node, or the destinations': a sum of the two keeps its map)
    shape = (k.rows, kp.buffers[out].heads, kp.buffers[out].dim)
    for a, b in (names, names[::-1]):
        if a == b or {a, b} & keep or readers.get(a) != [m] or readers.get(b) != [m]:
            continue
        wa, wb = writers.get(a, []), writers.get(b, [])
        if len(wa) != 1 or len(wb) != 1 or not wa[0] < wb[0] < m or b not in kp.zero_init:
            continue
        shapes = {(kp.buffers[n].domain, kp.buffers[n].heads, kp.buffers[n].dim) for n in (a, b)}
        if _accumulates(kp.kernels[wb[0]]) == b and shapes | {(k.rows, v.heads, v.dim) for v in loads} == {shape}:
            return m, wb[0], a, b
    return None


def _touching(kernels: list[Kernel]) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """Buffer -> the indices of the kernels that read it, and of those that write it."""
    readers: dict[str, list[int]] = {}
    writers: dict[str, list[int]] = {}
    for i, k in enumerate(kernels):
        for n in k.reads():
            readers.setdefault(n, []).append(i)
        for n in k.writes():
            writers.setdefault(n, []).append(i)
    return readers, writers
