"""The ``cpu`` backend: generate C/OpenMP, compile with the system compiler (cached), run via ctypes.

Example:
    >>> import torch
    >>> from rgtune.codegen.reference import ReferenceExecutor, init_params
    >>> from rgtune.data.synthetic import random_graph
    >>> from rgtune.ir.models import build_model
    >>> from rgtune.ir.pipeline import compile_program
    >>> g = random_graph((10, 20), num_relations=3, num_edges=100, seed=0)
    >>> kp = compile_program(build_model("rgat", 8, 8, 2)).kernels
    >>> built = CpuBackend().build(kp, g, {"gemm.tile_rows": 8})
    >>> params = init_params(kp, g, seed=0)
    >>> x = torch.randn(30, 8)
    >>> ref = ReferenceExecutor(kp, g).run(x.double(), {k: v.double() for k, v in params.items()})
    >>> bool((built.run(x, params) - ref).abs().max() < 1e-4)
    True
"""

from __future__ import annotations

import platform
import time
from typing import Any, Mapping

import torch

from rgtune.codegen.base import Backend, BackendError, BuiltProgram, CompiledProgram
from rgtune.codegen.cpu.compiler import (FLAGS, LIBS, check_openmp, compile_libraries, find_compiler,
                                         machine_fingerprint)
from rgtune.codegen.cpu.generate import GeneratedProgram, generate
from rgtune.codegen.cpu.runtime import CpuRuntime
from rgtune.data.batch import Batch
from rgtune.data.graph import HeteroGraph
from rgtune.codegen.cpu.schedule import CPU_SCHEDULE
from rgtune.ir.kernels import GemmKernel, KernelProgram, ScatterKernel, WeightGradKernel, WeightKernel


class CpuBackend(Backend):
    """Generated C kernels with OpenMP, compiled by ``$CC`` (default ``cc``) and called through ctypes."""

    name = "cpu"
    target = "cpu"
    training = "phases"  # CpuRuntime.run_forward / run_backward
    generates_sources = True

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """Whether a C compiler with OpenMP works here; if not, which one is needed and how to get it."""
        return check_openmp()

    def generate(self, kp: KernelProgram, schedule: Mapping[str, Any]) -> GeneratedProgram:
        """The C sources of ``kp`` under ``schedule``; an invalid schedule is an error, never compiled."""
        problems = CPU_SCHEDULE.check(kp, schedule)
        if problems:
            raise BackendError("invalid schedule for the cpu backend: " + "; ".join(problems))
        return generate(kp, schedule)

    def compile(self, kp: KernelProgram, schedule: Mapping[str, Any]) -> CompiledProgram:
        t0 = time.perf_counter()
        gen = self.generate(kp, schedule)
        libs = compile_libraries([s.text for s in gen.kernels])
        loaded = {s.kernel: lib.load() for s, lib in zip(gen.kernels, libs)}
        compiler = libs[0].compiler if libs else find_compiler()
        info = {
            "compiler": compiler.path, "compiler_version": compiler.version, "flags": " ".join(FLAGS + LIBS),
            "libraries": {s.kernel: str(lib.path) for s, lib in zip(gen.kernels, libs)},
            "source_paths": {s.kernel: str(lib.source_path) for s, lib in zip(gen.kernels, libs)},
            "compiled": sum(not lib.cache_hit for lib in libs), "cached": sum(lib.cache_hit for lib in libs),
            "acc_regs": gen.acc_regs, "placement": placement(kp, schedule),
        }
        return _CpuProgram(self.name, kp, dict(schedule), gen, loaded, time.perf_counter() - t0,
                           all(lib.cache_hit for lib in libs), info)

    def device_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"backend": self.name, "device": _cpu_model(), "omp_threads": torch.get_num_threads(),
                                "flags": " ".join(FLAGS + LIBS), "machine": machine_fingerprint()}
        try:
            comp = find_compiler()
            info.update(compiler=comp.version, compiler_path=comp.path)
        except BackendError as exc:
            info["compiler"] = f"unavailable: {exc}"
        return info


class _CpuProgram(CompiledProgram):
    """The loaded libraries of one kernel program and schedule; :meth:`bind` makes a :class:`CpuRuntime`."""

    def __init__(self, backend: str, kp: KernelProgram, schedule: dict[str, Any], gen: GeneratedProgram,
                 libs: dict[str, Any], seconds: float, cache_hit: bool, info: dict[str, Any]) -> None:
        self.backend, self.kp, self.schedule, self.gen, self.libs = backend, kp, schedule, gen, libs
        self.sources, self.compile_seconds, self.cache_hit, self.info = gen.sources, seconds, cache_hit, info

    def bind(self, graph: "HeteroGraph | Batch") -> BuiltProgram:
        t = time.perf_counter()
        runtime = CpuRuntime(self.kp, graph, self.schedule, self.gen, self.libs)
        info = {**self.info, "threads": torch.get_num_threads(), "bind_seconds": time.perf_counter() - t,
                "owner_blocks": runtime.blocks}
        training = self.kp.is_training
        return BuiltProgram(self.backend, self.sources, self.compile_seconds, self.cache_hit, runtime.run, info,
                            train_fn=runtime.run_training if training else None,
                            forward_fn=runtime.run_forward if training else None,
                            backward_fn=runtime.run_backward if training else None)


def placement(kp: KernelProgram, schedule: Mapping[str, Any]) -> dict[str, str]:
    """Kernel name -> where it runs (generated C, torch, or both)."""
    out = {}
    for k in kp.kernels:
        if isinstance(k, WeightKernel):
            out[k.name] = "torch (fold_weights)"
        elif isinstance(k, GemmKernel) and CPU_SCHEDULE.kernel_schedule(k, schedule)["impl"] == "blas":
            out[k.name] = "torch gather + per-segment matmul (BLAS); generated C bias/epilogue/store" + (
                "; torch index_add_" if k.accumulate else "")
        elif isinstance(k, WeightGradKernel) and CPU_SCHEDULE.kernel_schedule(k, schedule)["impl"] == "blas":
            out[k.name] = "torch gather + per-type X^T @ DY (BLAS)" if k.x else "torch index_add_ of dy rows by type"
        elif isinstance(k, ScatterKernel):
            out[k.name] = f"generated C ({CPU_SCHEDULE.kernel_schedule(k, schedule)['mapping']})"
        else:
            out[k.name] = "generated C"
    return out


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
