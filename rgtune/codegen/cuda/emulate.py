"""Run the generated CUDA on the CPU, for checking kernels where no GPU is present.

Each unit's CUDA source is compiled as C++ (``$CXX``, else ``c++``/``g++``) together with a
small header (:mod:`._emu_header`) that implements the CUDA built-ins the templates use:
every thread of a block is a green thread, ``__syncthreads`` and warp shuffles are real
barriers, ``__shared__`` memory is shared by the block, atomics are read-modify-writes.
:class:`EmulatedProgram` then runs a program through the same host code as the GPU
(:class:`~rgtune.codegen.cuda.runtime.ProgramRunner`: buffers, tile tables, grids, argument
binding), so a wrong index, tile bound, online softmax, atomic or grid shows up here.

What it cannot show: timing, races between blocks or warps (blocks run one after another
and every thread runs until it blocks, an order a GPU may also produce but need not),
memory-model and alignment faults, register or shared-memory limits. It is slow (one OS thread):
keep graphs small.

Example:
    >>> import torch
    >>> from rgtune.codegen.cuda.generate import generate
    >>> from rgtune.codegen.reference import ReferenceExecutor, init_params
    >>> from rgtune.data.synthetic import random_graph
    >>> from rgtune.ir.models import build_model
    >>> from rgtune.ir.pipeline import compile_program
    >>> g = random_graph((6, 9), num_relations=2, num_edges=30, seed=0)
    >>> kp = compile_program(build_model("rgcn", 8, 8)).kernels
    >>> params = init_params(kp, g, dtype=torch.float64)
    >>> x = torch.randn(15, 8, dtype=torch.float64)
    >>> out = EmulatedProgram(kp, generate(kp, {}).units, g).run(x, params)
    >>> torch.allclose(out.double(), ReferenceExecutor(kp, g).run(x, params), atol=1e-5)
    True
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import torch

from rgtune.codegen.base import BackendError, CompileError
from rgtune.codegen.cuda._emu_header import EMU_HEADER
from rgtune.codegen.cuda._unit import KernelUnit, Launch
from rgtune.codegen.cuda.nvrtc import cache_dir
from rgtune.codegen.cuda.runtime import LaunchError, ProgramRunner, _Loaded, _Step
from rgtune.data.graph import HeteroGraph
from rgtune.ir.kernels import KernelProgram

__all__ = ["EmulatedProgram", "find_cxx"]


def find_cxx() -> str | None:
    """A C++ compiler with ``ucontext.h`` (``$CXX``, else ``c++``, else ``g++``), or ``None``."""
    for name in ([os.environ["CXX"]] if os.environ.get("CXX") else []) + ["c++", "g++", "clang++"]:
        path = shutil.which(name)
        if path:
            return path
    return None


def _wrapper(launch: Launch) -> str:
    """``emu_<fn>(grid, block, args)``: calls the kernel in every emulated thread."""
    casts = []
    for i, a in enumerate(launch.args):
        if a.ctype.endswith("*"):
            casts.append(f"({a.ctype})a[{i}]")
        else:
            casts.append(f"({a.ctype})(intptr_t)a[{i}]")
    return (f"static void emu_call_{launch.function}(void** a) {{ {launch.function}({', '.join(casts)}); }}\n"
            f'extern "C" int emu_{launch.function}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, void** a) {{\n'
            f"  return rg_emu::run_grid(gx, gy, gz, bx, emu_call_{launch.function}, a);\n}}\n")


def emulation_source(unit: KernelUnit, arch: str) -> str:
    """What the C++ compiler gets: the header, the unit's code (not its header comments, which name the
    program: equal kernels of two programs share one library) and the launch wrappers."""
    wrappers = "".join(_wrapper(launch) for launch in {la.function: la for la in unit.launches}.values())
    cc = int(arch.split("_")[1]) * 10
    return f"#define __CUDA_ARCH__ {cc}\n{EMU_HEADER}\n{unit.code}\n{wrappers}"


def compile_emulation(unit: KernelUnit, arch: str = "sm_90", cxx: str | None = None) -> Path:
    """The shared library running ``unit`` on the CPU (cached by source hash)."""
    cxx = cxx or find_cxx()
    if cxx is None:
        raise BackendError("no C++ compiler (c++, g++, clang++) on PATH; set CXX")
    src = emulation_source(unit, arch)
    flags = ["-std=c++17", "-O1", "-shared", "-fPIC", "-fno-strict-aliasing", "-w"]
    key = hashlib.sha256("\0".join([src, cxx, *flags]).encode()).hexdigest()[:24]
    where = cache_dir() / "emu"
    where.mkdir(parents=True, exist_ok=True)
    lib = where / f"{key}.so"
    if lib.exists():
        return lib
    fd, tmp_src = tempfile.mkstemp(dir=where, suffix=".cpp")
    with os.fdopen(fd, "w") as f:
        f.write(src)
    tmp_lib = tmp_src[:-4] + ".so.tmp"
    cmd = [cxx, *flags, "-o", tmp_lib, tmp_src]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise CompileError(f"emulation of {unit.name} did not compile ({' '.join(cmd)}); source {tmp_src}\n"
                           f"{proc.stderr[-4000:]}", source_path=tmp_src, log=proc.stderr)
    os.replace(tmp_lib, lib)
    os.unlink(tmp_src)
    return lib


class EmulatedProgram(ProgramRunner):
    """A generated program run on the CPU: same interface as :class:`~.runtime.CudaProgram`."""

    def __init__(self, kp: KernelProgram, units: Sequence[KernelUnit], graph: HeteroGraph, arch: str = "sm_90",
                 workers: int | None = None) -> None:
        self.device = torch.device("cpu")
        self._bind(kp, graph)
        workers = workers or min(len(units), os.cpu_count() or 1) or 1
        with ThreadPoolExecutor(workers) as pool:
            libs = list(pool.map(lambda u: compile_emulation(u, arch), units))
        for u, lib in zip(units, libs):
            dll = ctypes.CDLL(str(lib))
            fns = {}
            for f in u.functions:
                fn = getattr(dll, f"emu_{f}")
                fn.restype = ctypes.c_int
                fn.argtypes = [ctypes.c_uint] * 4 + [ctypes.POINTER(ctypes.c_void_p)]
                fns[f] = fn
            self.loaded.append(_Loaded(u, fns, self._tables(u), dll))
        self._plan()

    def _launch(self, step: _Step, args: list[int]) -> None:
        arr = (ctypes.c_void_p * max(len(args), 1))(*args)
        if step.loaded.functions[step.launch.function](*step.grid, step.launch.threads, arr):
            raise LaunchError(f"{step.loaded.unit.name}/{step.launch.function}: threads of a block wait at different "
                              "barriers (a divergent __syncthreads or warp shuffle)")

    def synchronize(self) -> None:
        """Nothing runs asynchronously on the CPU."""

