"""Launching generated CUDA kernels on torch tensors; CUDA-event timing; device facts.

Host-side preparation (pure torch on the CPU, tested without a GPU):
:func:`gemm_segments` (a GEMM's type segments: row offsets and the weight slice of each),
:func:`balanced_tiles` (the tile -> segment table of ``block_partition=balanced``) and
:func:`grid_of` (every launch's grid).

On a GPU, :class:`CudaProgram` loads each unit's cubin with ``cupy.cuda.Module().load``,
checks launch resources against the function's attributes (threads per block, registers,
shared memory), and runs the program on torch CUDA tensors without copies: pointers are
``tensor.data_ptr()``, scalars 64-bit, launches go to torch's current stream.

Errors: an illegal address or a launch failure surfaces as :class:`LaunchError` for that
schedule, at launch or at the next synchronization (:meth:`CudaProgram.synchronize`).
Such an error is *sticky*: the CUDA context of the process is unusable afterwards, so the
tuner must measure in a worker process and restart the worker after one.

Example (no GPU needed):
    >>> import torch
    >>> balanced_tiles(torch.tensor([0, 5, 5, 12]), 4)
    (tensor([0, 4, 5, 9]), tensor([0, 0, 2, 2]))
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from rgtune.codegen.base import BackendError
from rgtune.codegen.cuda._expr import GRAPH_ARRAYS, GRAPH_CONSTANTS
from rgtune.codegen.cuda._gemm import segments_of
from rgtune.codegen.cuda._unit import Grid, KernelUnit, Launch
from rgtune.codegen.cuda.nvrtc import Cubin, check_resources
from rgtune.codegen.weights import fold_weights
from rgtune.data.graph import HeteroGraph
from rgtune.ir.bind import GraphArrays, graph_arrays, row_types
from rgtune.ir.kernels import GemmKernel, KernelProgram, WeightKernel

STICKY_NOTE = ("a CUDA fault is sticky: this process's CUDA context is unusable now; "
               "measure in a worker process and restart it")
_MAX_GRID_YZ = 65535


class LaunchError(BackendError):
    """A kernel failed to launch or faulted while running (see :data:`STICKY_NOTE`)."""

    #: a CUDA fault is sticky: every later call in this process fails, so the tuner's worker exits
    poisons_process = True


# --------------------------------------------------------------------------- host-side tables
def gemm_segments(k: GemmKernel, a: GraphArrays) -> tuple[torch.Tensor, torch.Tensor]:
    """``(seg_off, seg_type)``: the GEMM's rows (in iteration order) cut into same-weight segments.

    Rows of one segment share the weight slice ``seg_type[s]`` (the reference's per-row type,
    checked constant within every segment). Edge rows are iterated relation by relation
    through ``e_rel_order`` unless the weight is shared (``by="none"``).
    """
    n = a.rows(k.rows)
    if k.by == "none":
        return torch.tensor([0, n], dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
    seg_off = {"node_offsets": a.node_offsets, "rel_offsets": a.rel_offsets, "sp_offsets": a.sp_offsets,
               "dp_offsets": a.dp_offsets}[segments_of(k)].long()
    rows = a.e_rel_order.long() if k.rows == "edge" else torch.arange(n)
    types = row_types(a, k.rows, k.by, k.weight_end)[rows] if n else torch.zeros(0, dtype=torch.int64)
    counts = seg_off[1:] - seg_off[:-1]
    first = torch.clamp(seg_off[:-1], max=max(n - 1, 0))
    seg_type = torch.where(counts > 0, types[first] if n else torch.zeros_like(counts), torch.zeros_like(counts))
    if n and not torch.equal(torch.repeat_interleave(seg_type, counts), types):
        raise BackendError(f"{k.name}: rows of one segment need different weights; cannot tile by segment")
    return seg_off, seg_type


def balanced_tiles(seg_off: torch.Tensor, tile_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tile_row0, tile_seg)``: every tile of ``tile_rows`` rows, none straddling two segments."""
    counts = seg_off[1:] - seg_off[:-1]
    ntiles = (counts + tile_rows - 1) // tile_rows
    tile_seg = torch.repeat_interleave(torch.arange(len(counts)), ntiles)
    first_tile = torch.cumsum(ntiles, 0) - ntiles
    within = torch.arange(int(ntiles.sum())) - first_tile[tile_seg]
    return seg_off[:-1][tile_seg] + within * tile_rows, tile_seg


def grid_of(grid: Grid, rows: Mapping[str, int], tables: Mapping[str, torch.Tensor] | None = None
            ) -> tuple[int, int, int]:
    """The launch grid (``(0, 0, 0)``-like with a zero when there is nothing to do)."""
    if grid.kind == "items":
        return (math.ceil(rows[grid.domain] * grid.items_per_row / grid.per_block), 1, 1)
    assert tables is not None
    seg_off = tables["seg_off"]
    if grid.partition == "balanced":
        return (int(tables["tile_row0"].numel()), grid.col_blocks, 1)
    counts = seg_off[1:] - seg_off[:-1]
    most = int(((counts + grid.tile_rows - 1) // grid.tile_rows).max()) if counts.numel() else 0
    nseg = int(counts.numel())
    if nseg > _MAX_GRID_YZ:
        raise BackendError(f"{nseg} type segments exceed grid.z ({_MAX_GRID_YZ}); use block_partition=balanced")
    return (most, grid.col_blocks, nseg)


def gemm_tables(unit: KernelUnit, a: GraphArrays) -> dict[str, torch.Tensor]:
    """The ``table`` arguments of a GEMM unit (CPU tensors in the index width of the layout)."""
    k = unit.kernel
    assert isinstance(k, GemmKernel)
    grid = unit.launches[0].grid
    seg_off, seg_type = gemm_segments(k, a)
    out = {"seg_off": seg_off, "seg_type": seg_type}
    if grid.partition == "balanced":
        out["tile_row0"], out["tile_seg"] = balanced_tiles(seg_off, grid.tile_rows)
    idx = torch.int32 if a.index_bits == 32 else torch.int64
    return {name: t.to(idx).contiguous() for name, t in out.items()}


# --------------------------------------------------------------------------- device
def _cupy():
    try:
        import cupy
    except ImportError as e:
        raise BackendError(f"CuPy is not installed ({e})") from e
    return cupy


def gpu_count() -> tuple[int, str]:
    """Number of CUDA devices torch and CuPy both see, and why it is 0."""
    if not torch.cuda.is_available():
        return 0, "no CUDA GPU: torch.cuda.is_available() is False" + (
            " (a CPU-only torch build)" if torch.version.cuda is None else "")
    try:
        n = _cupy().cuda.runtime.getDeviceCount()
    except BackendError as e:
        return 0, str(e)
    except Exception as e:  # noqa: BLE001 - CUDARuntimeError and friends
        return 0, f"CuPy sees no CUDA device: {e}"
    return (n, "") if n else (0, "CuPy sees no CUDA device")


def device_arch(device: int | None = None) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def device_facts(device: int | None = None) -> dict[str, Any]:
    """Name, compute capability, driver and runtime versions of a GPU (needs one)."""
    cp = _cupy()
    props = torch.cuda.get_device_properties(device)
    driver, runtime = cp.cuda.runtime.driverGetVersion(), cp.cuda.runtime.runtimeGetVersion()
    return {"device": props.name, "compute_capability": f"{props.major}.{props.minor}",
            "arch": device_arch(device), "sm_count": props.multi_processor_count,
            "memory_gib": round(props.total_memory / 2**30, 1),
            "driver_version": driver, "runtime_version": runtime, "torch_cuda": torch.version.cuda,
            "runtime": f"CUDA runtime {_cuda_version(runtime)}, driver {_cuda_version(driver)}"}


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def program_of(built: Any) -> "CudaProgram":
    """The :class:`CudaProgram` behind a ``BuiltProgram`` of the cuda backend (for ``run(..., fill=)``)."""
    program = getattr(built.run_fn, "__self__", None)
    if not isinstance(program, ProgramRunner):
        raise TypeError("not a program built by the cuda backend")
    return program  # type: ignore[return-value]


@dataclass
class _Loaded:
    unit: KernelUnit
    functions: dict[str, Any]  # function name -> whatever the runner launches
    tables: dict[str, torch.Tensor]
    module: Any = None


class ProgramRunner:
    """Runs generated units on a graph: buffers, derived weights, grids, arguments, launch order.

    Subclasses say where the kernels run (:class:`CudaProgram`: a GPU through CuPy;
    :class:`rgtune.codegen.cuda.emulate.EmulatedProgram`: the CPU), by implementing
    ``_launch(function, grid, threads, args)`` with ``args`` as 64-bit integers (pointers
    and sizes, in the order of the kernel's parameters).
    """

    device: torch.device

    def _bind(self, kp: KernelProgram, graph: HeteroGraph) -> None:
        self.kp = kp
        self.arrays = graph_arrays(graph, kp.layout, kp.index_bits)
        a, dev = self.arrays, self.device
        self.rows = {d: a.rows(d) for d in ("node", "edge", "src_pair", "dst_pair")}
        self.graph = {n: getattr(a, n).to(dev).contiguous() for n in GRAPH_ARRAYS if getattr(a, n) is not None}
        self.consts = {n: getattr(a, n).to(device=dev, dtype=torch.float32).contiguous() for n in GRAPH_CONSTANTS}
        self.loaded: list[_Loaded] = []

    def _tables(self, u: KernelUnit) -> dict[str, torch.Tensor]:
        if not isinstance(u.kernel, GemmKernel):
            return {}
        return {n: t.to(self.device) for n, t in gemm_tables(u, self.arrays).items()}

    def run(self, x: torch.Tensor, params: Mapping[str, torch.Tensor], fill: float | None = None) -> torch.Tensor:
        """The output for input ``x`` (global node order) and ``params``.

        ``fill`` poisons every buffer that is not zero-initialized (NaN in tests: an element a
        kernel forgets to write then shows up in the output).
        """
        kp, dev = self.kp, self.device
        n = self.rows["node"]
        xin = _aligned(x.to(device=dev, dtype=torch.float32).reshape(n, -1))
        p = {name: _aligned(t.to(device=dev, dtype=torch.float32)) for name, t in params.items()}
        bufs: dict[str, torch.Tensor] = {kp.input: xin}
        for name, b in kp.buffers.items():
            if name == kp.input:
                continue
            shape = (self.rows[b.domain], b.width)
            if name in kp.zero_init:
                bufs[name] = torch.zeros(shape, device=dev)
            elif fill is not None:
                bufs[name] = torch.full(shape, fill, device=dev)
            else:
                bufs[name] = torch.empty(shape, device=dev)
        by_name = {ld.unit.name: ld for ld in self.loaded}
        with self._context():
            for k in kp.kernels:
                if isinstance(k, WeightKernel):
                    p[k.out] = _aligned(fold_weights(k, p, self.arrays, kp.param_shapes).float())
                    continue
                self._run_unit(by_name[k.name], bufs, p)
        return bufs[kp.output].view(n, -1)

    def _context(self) -> Any:
        import contextlib

        return contextlib.nullcontext()

    def _run_unit(self, ld: _Loaded, bufs: Mapping[str, torch.Tensor], params: Mapping[str, torch.Tensor]) -> None:
        temps = {t.name: torch.full((self.rows[t.domain], t.width), t.fill, device=self.device)
                 for t in ld.unit.temps}
        for launch in ld.unit.launches:
            grid = grid_of(launch.grid, self.rows, ld.tables)
            if 0 in grid:
                continue
            args = [self._arg(a, bufs, params, temps, ld.tables) for a in launch.args]
            self._launch(ld, launch, grid, args)

    def _launch(self, ld: _Loaded, launch: Launch, grid: tuple[int, int, int], args: list[int]) -> None:
        raise NotImplementedError

    def _arg(self, a: Any, bufs: Mapping[str, torch.Tensor], params: Mapping[str, torch.Tensor],
             temps: Mapping[str, torch.Tensor], tables: Mapping[str, torch.Tensor]) -> int:
        if a.kind == "size":
            return self.rows[a.ref]
        source = {"buffer": bufs, "param": params, "graph": self.graph, "const": self.consts, "temp": temps,
                  "table": tables}[a.kind]
        if a.ref not in source:
            raise BackendError(f"kernel argument {a.cname}: no {a.kind} {a.ref!r}")
        t = source[a.ref]
        idx = torch.int32 if self.kp.index_bits == 32 else torch.int64
        want = {"const float*": torch.float32, "float*": torch.float32, "const idx_t*": idx}.get(a.ctype)
        if want is not None and t.dtype != want:
            raise BackendError(f"kernel argument {a.cname}: {t.dtype}, expected {want}")
        return t.data_ptr()


class CudaProgram(ProgramRunner):
    """A generated program loaded on one GPU and bound to one graph: ``run(x, params) -> output``."""

    def __init__(self, kp: KernelProgram, units: list[KernelUnit], cubins: Mapping[str, Cubin],
                 graph: HeteroGraph, device: torch.device | int | None = None) -> None:
        cp = _cupy()
        self.device = torch.device("cuda", torch.cuda.current_device() if device is None else
                                   (device if isinstance(device, int) else device.index or 0))
        self._bind(kp, graph)
        with cp.cuda.Device(self.device.index):
            for u in units:
                module = cp.cuda.Module()
                module.load(cubins[u.name].data)
                fns = {f: module.get_function(f) for f in u.functions}
                self.loaded.append(_Loaded(u, fns, self._tables(u), module))
        problems = self.resource_problems()
        if problems:
            raise BackendError("launch resources exceeded: " + "; ".join(problems))

    def resource_problems(self) -> list[str]:
        """Threads, registers and shared memory of every function against this device's limits."""
        from rgtune.codegen.cuda.nvrtc import Resources

        drv = _cupy().cuda.driver
        props = torch.cuda.get_device_properties(self.device)
        regs = getattr(props, "regs_per_multiprocessor", 65536)
        smem = getattr(props, "shared_memory_per_block", 48 * 1024)
        out = []
        for ld in self.loaded:
            for launch in ld.unit.launches:
                f = ld.functions[launch.function]
                max_threads = drv.funcGetAttribute(drv.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f.ptr)
                res = Resources(registers=drv.funcGetAttribute(drv.CU_FUNC_ATTRIBUTE_NUM_REGS, f.ptr),
                                shared_bytes=drv.funcGetAttribute(drv.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f.ptr))
                out += [f"{ld.unit.name}: {p}" for p in check_resources(
                    res, launch.threads, launch.function, max_threads=max_threads, max_registers=regs,
                    max_shared=smem)]
        return out

    def _context(self) -> Any:
        return _cupy().cuda.Device(self.device.index)

    def _launch(self, ld: _Loaded, launch: Launch, grid: tuple[int, int, int], args: list[int]) -> None:
        import numpy as np

        cp = _cupy()
        stream = cp.cuda.ExternalStream(torch.cuda.current_stream(self.device).cuda_stream)
        packed = tuple(np.uint64(v) if a.ctype.endswith("*") else np.int64(v) for a, v in zip(launch.args, args))
        try:
            ld.functions[launch.function](grid, (launch.threads, 1, 1), packed, stream=stream)
        except Exception as e:  # noqa: BLE001 - CuPy's CUDADriverError and friends
            raise LaunchError(f"{ld.unit.name}/{launch.function} grid={grid} block={launch.threads}: {e}; "
                              f"{STICKY_NOTE}") from e

    def synchronize(self) -> None:
        """Wait for the device; a fault of an earlier launch is raised here as :class:`LaunchError`."""
        try:
            torch.cuda.synchronize(self.device)
        except Exception as e:  # noqa: BLE001 - RuntimeError, or torch.AcceleratorError in newer torch
            raise LaunchError(f"{e}; {STICKY_NOTE}") from e


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """Contiguous and 16-byte aligned (vector loads): a copy only when needed."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def time_cuda(fn: Any, warmup: int = 3, repeat: int = 20) -> dict[str, Any]:
    """Median milliseconds of ``fn()`` by CUDA events on the current stream (after ``warmup`` calls)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeat)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in events]
    return {"median_ms": statistics.median(times), "min_ms": min(times), "times_ms": times,
            "warmup": warmup, "repeat": repeat}
