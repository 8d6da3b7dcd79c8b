"""How busy the machine was while the tuner timed: the CPU time of processes other than this run's.

A time measured while other processes use the cores is slower, and unevenly so across schedules
(a schedule whose threads wait on each other loses more than one that streams), so a speedup
printed after such a run may not hold at idle. :class:`MachineLoad` reads the kernel's counters
(``/proc/stat``: the machine's busy CPU time; ``/proc/<pid>/stat``: this process's and its
descendants', the measurement worker among them) at the start and the end of a window and gives
the cores that *other* processes kept busy on average. On a system without ``/proc`` it measures
nothing (``None``).

Example:
    >>> load = MachineLoad.start()
    >>> sum(i * i for i in range(10_000)) > 0
    True
    >>> seen = load.stop()
    >>> seen is None or seen.other_cores >= 0.0
    True
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LoadSeen", "MachineLoad", "BUSY_CORES"]

#: other processes' average cores above which a timing is reported as taken on a busy machine
BUSY_CORES = 0.25

_PROC = Path("/proc")


@dataclass(frozen=True)
class LoadSeen:
    """What a window saw: ``other_cores`` (average cores kept busy by other processes) of ``cores``."""

    other_cores: float
    cores: int
    seconds: float

    @property
    def busy(self) -> bool:
        return self.other_cores > BUSY_CORES

    def describe(self) -> str:
        """One phrase: "other processes kept 0.93 of 2 cores busy over 12.5 s"."""
        return f"other processes kept {self.other_cores:.2f} of {self.cores} cores busy over {self.seconds:.1f} s"


class MachineLoad:
    """A window over the machine's CPU counters (see the module docstring); :meth:`stop` reads the end."""

    def __init__(self, busy: int, ours: int, wall: float) -> None:
        self._busy, self._ours, self._wall = busy, ours, wall

    @classmethod
    def start(cls) -> "MachineLoad | _NoLoad":
        busy = _machine_busy_ticks()
        if busy is None:
            return _NoLoad()
        return cls(busy, _our_ticks(), time.monotonic())

    def stop(self) -> LoadSeen | None:
        busy, ours, wall = _machine_busy_ticks(), _our_ticks(), time.monotonic()
        seconds = wall - self._wall
        if busy is None or seconds <= 0:
            return None
        ticks = os.sysconf("SC_CLK_TCK")
        other = max(0, (busy - self._busy) - (ours - self._ours)) / ticks
        return LoadSeen(other / seconds, os.cpu_count() or 1, seconds)


class _NoLoad:
    """Where the counters cannot be read: nothing measured."""

    def stop(self) -> None:
        return None


def _machine_busy_ticks() -> int | None:
    """The machine's busy CPU time so far (clock ticks): user, nice, system, irq, softirq and steal."""
    try:
        first = (_PROC / "stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    fields = [int(v) for v in first[1:]]
    # user nice system idle iowait irq softirq steal (guest time is already in user)
    return sum(fields[i] for i in (0, 1, 2, 5, 6, 7) if i < len(fields))


def _our_ticks() -> int:
    """CPU time (clock ticks) of this process and its descendants that are alive now, every thread's."""
    me = os.getpid()
    parents: dict[int, int] = {}
    times: dict[int, int] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited meanwhile
        # the command name is in parentheses and may hold spaces: the fields after its ")" are fixed
        rest = stat[stat.rfind(")") + 2:].split()
        pid = int(entry.name)
        parents[pid] = int(rest[1])
        times[pid] = int(rest[11]) + int(rest[12])  # utime, stime
    ours, frontier = {me}, [me]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in ours:
                ours.add(pid)
                frontier.append(pid)
    return sum(times.get(pid, 0) for pid in ours)
