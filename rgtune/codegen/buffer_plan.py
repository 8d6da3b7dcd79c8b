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

from typing import Iterable, Mapping, Sequence

from rgtune.ir.kernels import Kernel


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
