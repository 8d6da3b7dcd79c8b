"""Backends that misbehave on purpose, loaded by name ("_faulty_backends:Hang") in the worker."""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any, Mapping

from rgtune.codegen.base import BuiltProgram, ReferenceBackend
from rgtune.codegen.cpu.backend import CpuBackend


class _Faulty(ReferenceBackend):
    name = "faulty"

    def fault(self, schedule: Mapping[str, Any]) -> bool:
        """Misbehave on every point unless RGTUNE_FAULT_KNOB names a knob=value that triggers it."""
        spec = os.environ.get("RGTUNE_FAULT_KNOB")
        if not spec:
            return True
        knob, _, value = spec.partition("=")
        return str(schedule.get(knob)) == value

    def misbehave(self, out: Any) -> Any:
        raise NotImplementedError

    def build(self, kp: Any, graph: Any, schedule: Mapping[str, Any]) -> BuiltProgram:
        built = super().build(kp, graph, schedule)
        if not self.fault(schedule):
            return built
        inner = built.run_fn
        built.run_fn = lambda x, p: self.misbehave(inner(x, p))
        return built


class Hang(_Faulty):
    def misbehave(self, out: Any) -> Any:
        while True:
            time.sleep(1)


class Segfault(_Faulty):
    def misbehave(self, out: Any) -> Any:
        ctypes.string_at(0)  # reads address 0: SIGSEGV
        return out


class Wrong(_Faulty):
    def misbehave(self, out: Any) -> Any:
        return out + 0.5


class Slow(_Faulty):
    """Correct, but every run takes a while (for interrupting a study mid-trial)."""

    def misbehave(self, out: Any) -> Any:
        time.sleep(float(os.environ.get("RGTUNE_SLOW_SECONDS", "0.5")))
        return out


class Poisoned(_Faulty):
    """Raises an error that leaves the process unusable (as a CUDA fault does)."""

    def misbehave(self, out: Any) -> Any:
        err = RuntimeError("illegal memory access (simulated)")
        err.poisons_process = True  # type: ignore[attr-defined]
        raise err


class Flaky(_Faulty):
    """Right on a program's first run, wrong on every later one (a data race's kind of luck): one
    verification passes it, running it again on the same input does not."""

    def build(self, kp: Any, graph: Any, schedule: Mapping[str, Any]) -> BuiltProgram:
        built = ReferenceBackend.build(self, kp, graph, schedule)
        if not self.fault(schedule):
            return built
        inner, runs = built.run_fn, [0]

        def run(x: Any, p: Any) -> Any:
            runs[0] += 1
            out = inner(x, p)
            return out if runs[0] == 1 else out + 0.5

        built.run_fn = run
        return built


def _matches(schedule: Mapping[str, Any], spec: str) -> bool:
    """Whether every ``knob=value`` of the comma-separated ``spec`` holds in ``schedule``."""
    pairs = [item.partition("=") for item in spec.split(",") if item]
    return bool(pairs) and all(str(schedule.get(k)) == v for k, _, v in pairs)


class ChaosCpu(CpuBackend):
    """The cpu backend (generated C, its compile cache), whose kernels hang on the schedules that match
    every ``knob=value`` of ``$RGTUNE_HANG_KNOBS`` (comma-separated): a fault-injection run's hangs."""

    def build(self, kp: Any, graph: Any, schedule: Mapping[str, Any]) -> BuiltProgram:
        built = super().build(kp, graph, schedule)
        if _matches(schedule, os.environ.get("RGTUNE_HANG_KNOBS", "")):
            built.run_fn = lambda x, p: Hang().misbehave(None)
        return built


class Environ(ReferenceBackend):
    """Correct; its device info says what the worker process started with: ``RGTUNE_TEST_MARK`` and torch's
    thread count."""

    name = "environ"

    def device_info(self) -> dict[str, Any]:
        import torch

        return {**super().device_info(), "mark": os.environ.get("RGTUNE_TEST_MARK"), "threads": torch.get_num_threads()}
