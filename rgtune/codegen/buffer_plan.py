"""Which intermediate buffers of a kernel program can share memory: live intervals and slots.

A buffer is live from the first kernel that touches it to the last one. Two buffers whose
intervals do not overlap never hold values at the same time, so they can live in one memory
slot. A training program makes this matter: its forward's edge buffers are dead once the forward
ends (those the backward reads are saved apart), its backward's are dead before the forward
runs, and a recomputed forward value lives only at the start of the backward. Without sharing a
runtime holds every buffer of both phases at once.

:func:`plan_slots` assigns buffers to slots greedily in order of first use (the interval-graph
colouring, optimal in the number of slots), choosing among the free slots the smallest one that
fits, else the largest (which then grows): a few large slots end up shared by the large buffers.

Example:
    >>> intervals = {"a": (0, 1), "b": (1, 2), "c": (2, 3), "d": (3, 3)}
    >>> sizes = {"a": 100, "b": 10, "c": 80, "d": 50}
    >>> slot_of, slot_sizes = plan_slots(intervals, sizes)
    >>> slot_of["a"] == slot_of["c"], slot_of["b"] == slot_of["d"], slot_sizes
    (True, True, [100, 50])
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import numpy as np

from rgtune.ir.kernels import Kernel

if TYPE_CHECKING:
    from rgtune.data.graph import HeteroGraph
    from rgtune.ir.kernels import KernelProgram


def live_intervals(kernels: Sequence[Kernel], names: Iterable[str]) -> dict[str, tuple[int, int]]:
    """``name -> (first, last)`` index of the kernels that read or write it, for each of ``names``
    that a kernel touches."""
    wanted = set(names)
    out: dict[str, tuple[int, int]] = {}
    for i, k in enumerate(kernels):
        for name in (k.reads() | k.writes()) & wanted:
            first = out.get(name, (i, i))[0]
            out[name] = (first, i)
    return out


def plan_slots(intervals: Mapping[str, tuple[int, int]],
               sizes: Mapping[str, int]) -> tuple[dict[str, int], list[int]]:
    """``(name -> slot, slot sizes)``: buffers with overlapping intervals (inclusive) in different
    slots, each slot as large as its largest buffer (see the module docstring)."""
    slot_of: dict[str, int] = {}
    slot_sizes: list[int] = []
    free_after: list[int] = []  # per slot: the last kernel index of its current buffer
    for name in sorted(intervals, key=lambda n: (intervals[n][0], -sizes[n], n)):
        first, last = intervals[name]
        free = [s for s in range(len(slot_sizes)) if free_after[s] < first]
        fits = [s for s in free if slot_sizes[s] >= sizes[name]]
        if fits:
            slot = min(fits, key=lambda s: slot_sizes[s])
        elif free:
            slot = max(free, key=lambda s: slot_sizes[s])
            slot_sizes[slot] = sizes[name]
        else:
            slot = len(slot_sizes)
            slot_sizes.append(sizes[name])
            free_after.append(last)
        free_after[slot] = last
        slot_of[name] = slot
    return slot_of, slot_sizes


def footprint_bytes(kp: "KernelProgram", graph: "HeteroGraph", share_slots: bool = True) -> int:
    """The memory a run of ``kp`` on ``graph`` holds at its peak, estimated before building it: the caller's
    buffers (input, output, a training step's output gradient, input gradient and saved values), the
    intermediate buffers (sharing slots as :func:`plan_slots` plans them where the backend does,
    ``share_slots``; each its own otherwise), the params (and their gradients), the graph's index arrays
    and the per-edge constants the kernels read (float32, :meth:`~rgtune.ir.bind.GraphArrays.graph_constant`).
    Float32 values; what a backend adds on top (scratch rows, compiled code) is small next to a big
    graph's per-edge buffers.

    Example:
        >>> from rgtune.data.synthetic import random_graph
        >>> from rgtune.ir.pipeline import compile_program
        >>> from rgtune.ir.registry import build_model
        >>> g = random_graph((100, 100), num_relations=2, num_edges=1000, seed=0)
        >>> kp = compile_program(build_model("rgat", 16, 16), {}, g, training=True).kernels
        >>> footprint_bytes(kp, g) <= footprint_bytes(kp, g, share_slots=False)
        True
    """
    from rgtune.codegen.reference import param_full_shape
    from rgtune.ir.bind import graph_arrays
    from rgtune.ir.passes.precision import element_bytes

    a = graph_arrays(graph, kp.layout, kp.index_bits)
    size = {n: a.rows(b.domain) * b.width * element_bytes(b.dtype) for n, b in kp.buffers.items()}
    own = {kp.input, kp.dout, kp.output, kp.input_grad, *kp.saved} - {None}
    names = [n for n in kp.buffers if n not in own]
    if share_slots:
        intervals = live_intervals(kp.kernels, names)
        for j, n in enumerate(n for n in names if n not in intervals):
            intervals[n] = (len(kp.kernels) + j, len(kp.kernels) + j)
        intermediate = sum(plan_slots(intervals, {n: size[n] for n in intervals})[1])
    else:
        intermediate = sum(size[n] for n in names)
    params = sum(int(np.prod(param_full_shape(kp, p, a))) * 4 for p in kp.param_shapes)
    index = sum(t.numel() * t.element_size() for t in a.index_tensors().values())
    constants = len(graph_constants(kp.kernels)) * a.num_edges * 4
    return int(sum(size[n] for n in own) + intermediate + params + index + constants)


def graph_constants(kernels: Sequence[Kernel]) -> set[str]:
    """The per-edge graph constants (:class:`~rgtune.ir.kernels.GraphLoad` kinds) that ``kernels`` read."""
    from rgtune.ir.kernels import GraphLoad

    found: set[str] = set()

    def walk(obj: object) -> None:
        if isinstance(obj, GraphLoad):
            found.add(obj.kind)
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            for f in dataclasses.fields(obj):
                walk(getattr(obj, f.name))
        elif isinstance(obj, (list, tuple)):
            for item in obj:
                walk(item)
        elif isinstance(obj, dict):
            for item in obj.values():
                walk(item)

    walk(list(kernels))
    return found
