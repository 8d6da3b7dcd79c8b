"""The NVRTC compile ledger the CUDA compile sweeps share: every unit compiled once per architecture in a
test module, checked against the launch limits ptxas reports, and what it cost.

Which architectures: by default every unit for ``sm_90`` (the GPUs rgtune is tuned on) and, for the
other architectures of :data:`rgtune.codegen.cuda.nvrtc.ARCHS` (``sm_80``), the units whose code differs
by architecture (``#if __CUDA_ARCH__``: a scatter's vector atomics); the rest is the same source through
the same front end, so a second architecture is mostly a second ptxas run. ``RGTUNE_EXHAUSTIVE=1``
compiles every unit for every architecture.

A unit that compiled cleanly is recorded in the session's cache folder (``RGTUNE_CACHE_DIR``, which the
test processes of a run share): another module's sweep, or the other worker's, counts it as checked
(a unit's code decides its compile: it is the same check) instead of compiling it again. One with
problems is not recorded: every sweep that has it reports them.

Use from a test module::

    from _nvrtc_ledger import Ledger, ledger  # noqa: F401  (``ledger`` is a module fixture)

    def test_sweep(ledger: Ledger) -> None:
        problems = ledger.compile("my group", [generate(kernels, cfg), ...])
        assert not problems, "\\n".join(problems[:5])
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import pytest

from rgtune.codegen.cuda import nvrtc

__all__ = ["Ledger", "ledger", "print_at_end", "PRIMARY_ARCH"]

#: compiled for every unit in every run
PRIMARY_ARCH = "sm_90"
WORKERS = max(os.cpu_count() or 1, 1)


def _every_arch() -> bool:
    return os.environ.get("RGTUNE_EXHAUSTIVE") == "1"


@dataclass
class Ledger:
    """Every unit compiled (deduplicated by code and architecture), per group: new units, wall seconds, and
    each program's CPU seconds to compile all of its units cold."""

    cpu: dict[tuple[str, str], float] = field(default_factory=dict)  # (unit key, arch) -> CPU seconds
    groups: dict[str, tuple[int, float]] = field(default_factory=dict)  # new units, wall seconds
    per_program: dict[str, list[float]] = field(default_factory=dict)
    #: units another sweep of the session had compiled cleanly (its CPU seconds are in ``cpu``)
    found: set[tuple[str, str]] = field(default_factory=set)

    @staticmethod
    def archs_of(unit: Any) -> tuple[str, ...]:
        """The architectures ``unit`` is compiled for (see the module's docstring)."""
        if _every_arch() or "__CUDA_ARCH__" in unit.code:
            return tuple(nvrtc.ARCHS)
        return (PRIMARY_ARCH,)

    def compile(self, group: str, programs: Sequence[Any]) -> list[str]:
        """Compiles every new unit of ``programs`` (objects with ``.units``) in parallel; the problems found
        (compile errors, launch limits), each naming its unit and architecture."""
        t0 = time.perf_counter()
        todo: dict[tuple[str, str], Any] = {}
        for prog in programs:
            for u in prog.units:
                for arch in self.archs_of(u):
                    if (u.key, arch) not in self.cpu:
                        if (cpu := _checked_before(u.key, arch)) is not None:
                            self.cpu[(u.key, arch)] = cpu
                            self.found.add((u.key, arch))
                        else:
                            todo.setdefault((u.key, arch), u)
        problems: list[str] = []
        with ThreadPoolExecutor(WORKERS) as pool:
            for key, (found, cpu) in zip(todo, pool.map(_compile_one, todo.items())):
                problems += found
                self.cpu[key] = cpu
                if not found:
                    _record_checked(*key, cpu)
        units, wall = self.groups.get(group, (0, 0.0))
        self.groups[group] = (units + len({k for k, _ in todo}), wall + time.perf_counter() - t0)
        self.per_program.setdefault(group, []).extend(
            sum(self.cpu.get((u.key, arch), 0.0) for u in {u.key: u for u in prog.units}.values()
                for arch in self.archs_of(u))
            for prog in programs)
        return problems

    def summary(self) -> list[str]:
        lines = [f"CUDA compile summary (NVRTC {'.'.join(map(str, nvrtc.nvrtc_version()))}, "
                 f"{'every unit for ' + ' + '.join(nvrtc.ARCHS) if _every_arch() else PRIMARY_ARCH + ', by-arch units for all'}"
                 f", {WORKERS} threads). Per program: CPU seconds to compile its units cold; units shared by "
                 "programs are compiled once"]
        for group, (units, wall) in self.groups.items():
            s = sorted(self.per_program[group]) or [0.0]
            lines.append(f"  {group:26s} {len(self.per_program[group]):5d} programs, {units:5d} new unique units, wall {wall:6.1f} s; "
                         f"per program median {statistics.median(s):.2f} s, max {s[-1]:.2f} s")
        total = sum(self.cpu.values())
        lines.append(f"  all: {len(self.cpu)} compiles, {total:.1f} CPU s "
                     f"({total / max(len(self.cpu), 1) * 1000:.0f} ms each); {len(self.found)} of them compiled cleanly "
                     "by another sweep of this session, not again")
        return lines


def _record_path(key: str, arch: str) -> Path | None:
    root = os.environ.get("RGTUNE_CACHE_DIR")
    return Path(root) / "nvrtc-ledger" / f"{key}-{arch}" if root else None


def _checked_before(key: str, arch: str) -> float | None:
    """The CPU seconds of a clean compile of ``key`` for ``arch`` in this session, if one was recorded."""
    path = _record_path(key, arch)
    try:
        return float(path.read_text()) if path is not None else None
    except (OSError, ValueError):
        return None


def _record_checked(key: str, arch: str, cpu: float) -> None:
    path = _record_path(key, arch)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{cpu:.6f}")
    os.replace(tmp, path)  # whole or absent for a reader


def _compile_one(job: tuple[tuple[str, str], Any]) -> tuple[list[str], float]:
    (_, arch), u = job
    t = time.thread_time()  # NVRTC runs in this thread: its CPU time, whatever else the machine does
    try:
        cubin = nvrtc.compile_source(u.source, f"{u.name}.cu", arch, u.code, cache=None)
    except Exception as e:  # noqa: BLE001 - reported with the others
        return [f"{u.name} ({arch}): {str(e)[:3000]}"], 0.0
    problems = []
    for launch in u.launches:
        res = cubin.resources.get(launch.function)
        problems += ([f"{u.name} ({arch}): no ptxas report for {launch.function}"] if res is None else
                     [f"{u.name} ({arch}): {p}" for p in nvrtc.check_resources(res, launch.threads, launch.function)])
    return problems, time.thread_time() - t


def print_at_end(request: pytest.FixtureRequest, lines: list[str]) -> None:
    """Past pytest's output capture, so it shows without ``-s`` (in a one-process run; pytest-xdist's
    workers keep their output)."""
    capman = request.config.pluginmanager.get_plugin("capturemanager")
    quiet = capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext()
    with quiet:
        sys.stdout.write("\n" + "\n".join(lines) + "\n")
        sys.stdout.flush()


@pytest.fixture(scope="module")
def ledger(request: pytest.FixtureRequest) -> Iterator[Ledger]:
    """One ledger per test module; its summary is printed when the module is done."""
    led = Ledger()
    yield led
    if led.groups:
        print_at_end(request, led.summary())
