"""Launching generated CUDA kernels on torch tensors; CUDA-event timing; device facts.

Host-side preparation (pure torch on the CPU, tested without a GPU):
:func:`gemm_segments` (a GEMM's type segments: row offsets and the weight slice of each),
:func:`balanced_tiles` (the tile -> segment table of ``block_partition=balanced``),
:func:`scatter_groups` (a scatter's rows grouped by the row they add into, once per graph),
:func:`weightgrad_tables` (a weight gradient's row chunks) and :func:`grid_of` (every launch's grid).

On a GPU, :class:`CudaProgram` loads each unit's cubin with ``cupy.cuda.Module().load``,
checks launch resources against the function's attributes (threads per block, registers,
shared memory), and runs the program on torch CUDA tensors without copies: pointers are
``tensor.data_ptr()``, scalars 64-bit, launches go through ``cuLaunchKernel`` to torch's
current stream. Every launch's grid and fixed arguments are bound once (:meth:`ProgramRunner._plan`),
and by default the whole program is recorded as a CUDA graph on its first run and replayed.

Training programs (:attr:`KernelProgram.is_training`) run in two phases, as a layer in a model trains:
:meth:`ProgramRunner.run_forward` runs the forward kernels and returns the output and a
:class:`~rgtune.codegen.base.Saved` (fresh tensors: the buffers the backward reads and the weights the
forward folded); :meth:`ProgramRunner.run_backward` binds them with the output's gradient (``dout``)
and runs the backward kernels into fresh zeroed gradient params of the params' full shapes (which the
weight-gradient kernels add into or overwrite); a saved buffer the backward writes is copied first,
so the caller's stays as the forward left it. :meth:`ProgramRunner.run_training` runs both in one
go; :meth:`ProgramRunner.run` of a training program runs its forward kernels only. On a GPU each
phase (and a whole step) is recorded as a CUDA graph of its own.

Dtypes: the kernels read and write float32 (:data:`KERNEL_DTYPE`). A run casts ``x`` and the
params to float32 on the program's device (a copy only when they are not already), allocates
every buffer and temp as float32 whatever torch's default dtype is (a buffer that ``precision.*``
stores in bfloat16 or float16 in that type), and returns float32.

Threads: a program's runs share state (the recorded graph's input and output buffers, the
kernel parameter arrays, and in the emulator the kernels' own globals), so
:meth:`ProgramRunner.run` holds a lock per program: calls from several threads are safe and run
one at a time. A replay queued on another stream than the last one also waits, on the device,
for the last one before it overwrites the recorded graph's input.

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

import contextlib
import ctypes
import gc
import statistics
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import torch

from rgtune.codegen.base import BackendError, Saved, TrainingResult
from rgtune.codegen.cuda._expr import GRAPH_ARRAYS, GRAPH_CONSTANTS
from rgtune.codegen.cuda._gemm import segments_of
from rgtune.codegen.cuda._unit import Arg, Grid, KernelUnit, Launch
from rgtune.codegen.cuda.nvrtc import Cubin, check_resources
from rgtune.codegen.reference import param_full_shape
from rgtune.codegen.weights import fold_weights
from rgtune.data.graph import HeteroGraph
from rgtune.ir.bind import GraphArrays, graph_arrays, row_types
from rgtune.ir.kernels import GemmKernel, KernelProgram, ScatterKernel, WeightGradKernel, WeightKernel
from rgtune.ir.passes.precision import STORAGE_TYPES, torch_dtype
from rgtune.ir.program import EDGE_WEIGHT

STICKY_NOTE = ("a CUDA fault is sticky: this process's CUDA context is unusable now; "
               "measure in a worker process and restart it")
_MAX_GRID_YZ = 65535
#: gridDim.x's limit (compute capability 3.0 and later); the kernels index blocks in 64 bits past it
_MAX_GRID_X = 2**31 - 1

#: the dtype every generated kernel reads and writes: inputs, params, buffers, temps (the buffers that
#: ``precision.*`` stores in 16 bits excepted)
KERNEL_DTYPE = torch.float32
_LOW_PRECISION = {torch_dtype(t) for t in STORAGE_TYPES} - {KERNEL_DTYPE}


class LaunchError(BackendError):
    """A kernel failed to launch or faulted while running (see :data:`STICKY_NOTE`)."""

    #: a CUDA fault is sticky: every later call in this process fails, so the tuner's worker exits
    poisons_process = True


# --------------------------------------------------------------------------- host-side tables
def gemm_segments(k: GemmKernel | WeightGradKernel, a: GraphArrays) -> tuple[torch.Tensor, torch.Tensor]:
    """``(seg_off, seg_type)``: the GEMM's rows (in iteration order) cut into same-weight segments.

    Rows of one segment share the weight slice ``seg_type[s]`` (the reference's per-row type,
    checked constant within every segment). Edge rows are iterated relation by relation
    through ``e_rel_order`` unless the weight is shared (``by="none"``). A weight gradient's rows
    are the rows of the GEMM whose weight it is, so it is cut the same way.
    """
    n = a.rows(k.rows)
    if k.by == "none":
        return torch.tensor([0, n], dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
    seg_off = {"node_offsets": a.node_offsets, "rel_offsets": a.rel_offsets, "sp_offsets": a.sp_offsets,
               "dp_offsets": a.dp_offsets}[segments_of(k)].long()  # node rows: runs of one type
    if k.rows == "dst_node":  # the destinations' runs (the first rows)
        seg_off = torch.clamp(seg_off, max=n)
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
    """The launch grid (``(0, 0, 0)``-like with a zero when there is nothing to do).

    A grid past the device's limits (``x`` up to ``2**31 - 1`` blocks, ``y`` and ``z`` up to 65535)
    is a :class:`BackendError` naming the dimension, not a launch that fails or runs part of the rows:

    >>> grid_of(Grid("items", "edge", 64, 128), {"edge": 42_182_144})  # ogbn-mag with reverse relations
    (21091072, 1, 1)
    >>> grid_of(Grid("items", "edge", 64, 32), {"edge": 2**31})
    Traceback (most recent call last):
    ...
    rgtune.codegen.base.BackendError: launch grid (4294967296, 1, 1) over 2147483648 edge rows: grid.x 4294967296 exceeds 2147483647; choose more work per block (tile_rows, threads or coarsening)
    """
    if grid.kind == "items":
        # integer ceiling: a float quotient rounds past 2**53 work items
        return _within_limits((-(-rows[grid.domain] * grid.items_per_row // grid.per_block), 1, 1), grid, rows)
    assert tables is not None
    if grid.kind == "chunks":
        return _within_limits((int(tables["chunk_row0"].numel()), grid.col_blocks, 1), grid, rows)
    seg_off = tables["seg_off"]
    if grid.partition == "balanced":
        return _within_limits((int(tables["tile_row0"].numel()), grid.col_blocks, 1), grid, rows)
    counts = seg_off[1:] - seg_off[:-1]
    most = int(((counts + grid.tile_rows - 1) // grid.tile_rows).max()) if counts.numel() else 0
    nseg = int(counts.numel())
    if nseg > _MAX_GRID_YZ:
        raise BackendError(f"{nseg} type segments exceed grid.z ({_MAX_GRID_YZ}); use block_partition=balanced")
    return _within_limits((most, grid.col_blocks, nseg), grid, rows)


def _within_limits(dims: tuple[int, int, int], grid: Grid, rows: Mapping[str, int]) -> tuple[int, int, int]:
    """``dims``, or a :class:`BackendError` naming the dimension past its limit."""
    for axis, n, limit in (("x", dims[0], _MAX_GRID_X), ("y", dims[1], _MAX_GRID_YZ), ("z", dims[2], _MAX_GRID_YZ)):
        if n > limit:
            raise BackendError(f"launch grid {dims} over {rows.get(grid.domain, '?')} {grid.domain} rows: grid.{axis} "
                               f"{n} exceeds {limit}; choose more work per block (tile_rows, threads or coarsening)")
    return dims


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


#: where a scatter's rows add (``(rows, out_via)``) -> the array of that target per row
_SCATTER_TARGETS = {("edge", "src"): "e_src", ("edge", "src_pair"): "e_sp", ("src_pair", "pair_node"): "sp_node",
                    ("dst_pair", "pair_node"): "dp_node"}


def scatter_groups(k: ScatterKernel, a: GraphArrays) -> tuple[torch.Tensor, torch.Tensor]:
    """``(group_perm, group_off)``: the rows of ``k`` grouped by the row they add into (``scatter.mapping
    = src_parallel``): target ``v``'s rows are ``group_perm[group_off[v] .. group_off[v + 1]]``, in
    layout order. Built once per graph, layout and index width (kept with ``a``: scatters of every
    program on the graph share them).

    >>> from rgtune.data.synthetic import random_graph
    >>> a = graph_arrays(random_graph((3, 2), num_relations=2, num_edges=6, seed=0), "csr_dst", 32)
    >>> perm, off = scatter_groups(ScatterKernel("s", out="g", out_via="src"), a)
    >>> torch.equal(a.e_src[perm].long(), torch.sort(a.e_src.long()).values), int(off[-1]) == a.num_edges
    (True, True)
    """
    key = (k.rows, k.out_via)
    if key not in _SCATTER_TARGETS:
        raise BackendError(f"{k.name}: no grouping of {k.rows} rows by {k.out_via}")
    cache = a.__dict__.setdefault("_cuda_scatter_groups", {})  # GraphArrays is frozen: its __dict__ holds it
    if key not in cache:
        target = getattr(a, _SCATTER_TARGETS[key]).long()
        targets = a.rows("src_pair" if k.out_via == "src_pair" else "node")
        perm = torch.sort(target, stable=True).indices
        off = torch.zeros(targets + 1, dtype=torch.int64)
        off[1:] = torch.cumsum(torch.bincount(target, minlength=targets), 0)
        cache[key] = (perm, off)
    return cache[key]


def weightgrad_tables(unit: KernelUnit, a: GraphArrays) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """A weight gradient's row chunks, and its counts (``chunks``, ``types``: domains of its grids and temps).

    Each type segment of the rows (:func:`gemm_segments`) is cut into chunks of ``chunk_rows``
    (the grid's ``tile_rows``): ``chunk_row0`` / ``chunk_row_end`` (iteration positions) and
    ``chunk_type`` (the gradient slice), sorted by type, so that ``type_chunk_off`` delimits the
    chunks of each type (what the second pass of ``reduction=two_pass`` sums).

    >>> from rgtune.codegen.cuda._unit import KernelUnit, Launch
    >>> from rgtune.data.synthetic import random_graph
    >>> a = graph_arrays(random_graph((3, 2), num_relations=2, num_edges=6, seed=0), "csr_dst", 32)
    >>> k = WeightGradKernel("wg", rows="node", by="ntype")
    >>> unit = KernelUnit(k, "", "", (Launch("weightgrad", Grid("chunks", "node", tile_rows=2), 32, ()),))
    >>> tables, counts = weightgrad_tables(unit, a)
    >>> tables["chunk_row0"].tolist(), tables["chunk_row_end"].tolist(), tables["type_chunk_off"].tolist(), counts
    ([0, 2, 3], [2, 3, 5], [0, 2, 3], {'chunks': 3, 'types': 2})
    """
    k = unit.kernel
    assert isinstance(k, WeightGradKernel)
    seg_off, seg_type = gemm_segments(k, a)
    chunk_rows = unit.launches[0].grid.tile_rows
    row0, seg = balanced_tiles(seg_off, chunk_rows)
    end = torch.minimum(row0 + chunk_rows, seg_off[1:][seg])
    ctype = seg_type[seg]
    order = torch.sort(ctype, stable=True).indices  # each type's chunks together (segments of one type may repeat)
    types = {"ntype": a.num_ntypes, "rel": a.num_rels, "none": 1}[k.by]
    type_off = torch.zeros(types + 1, dtype=torch.int64)
    type_off[1:] = torch.cumsum(torch.bincount(ctype, minlength=types), 0)
    tables = {"chunk_row0": row0[order], "chunk_row_end": end[order], "chunk_type": ctype[order],
              "type_chunk_off": type_off}
    idx = torch.int32 if a.index_bits == 32 else torch.int64
    return ({name: t.to(idx).contiguous() for name, t in tables.items()},
            {"chunks": int(row0.numel()), "types": types})


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
class _Step:
    """One launch, bound once: its grid and the arguments that stay the same from run to run.

    Graph arrays, per-edge constants, tile tables and sizes are fixed when a program is bound to
    its graph; only buffers, params and temps change per run (``per_run``: their positions).
    Resolving the rest once keeps the host's work per launch to a few writes, which matters on a
    GPU, where a small graph's kernels take microseconds.
    """

    loaded: "_Loaded"
    launch: Launch
    grid: tuple[int, int, int]
    values: list[int]
    per_run: tuple[tuple[int, Arg], ...]
    state: Any = None  # what a runner keeps per launch (CudaProgram: the packed kernel parameters)


@dataclass
class _Loaded:
    unit: KernelUnit
    functions: dict[str, Any]  # function name -> whatever the runner launches
    tables: dict[str, torch.Tensor]
    module: Any = None
    steps: list[_Step] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)  # the program's row counts and the unit's own counts


_PER_RUN_KINDS = ("buffer", "param", "temp")


def _per_run(a: Arg) -> bool:
    """Whether an argument changes from run to run: buffers, params, temps and the caller's edge weight."""
    return a.kind in _PER_RUN_KINDS or (a.kind == "const" and a.ref == EDGE_WEIGHT)


class ProgramRunner:
    """Runs generated units on a graph: buffers, derived weights, grids, arguments, launch order.

    Subclasses say where the kernels run (:class:`CudaProgram`: a GPU through CuPy;
    :class:`rgtune.codegen.cuda.emulate.EmulatedProgram`: the CPU): they load every unit into
    ``self.loaded``, call :meth:`_plan`, and implement ``_launch(step, args)`` with ``args`` as
    64-bit integers (pointers and sizes, in the order of the kernel's parameters). A subclass
    that runs differently overrides :meth:`_execute`; :meth:`run` holds the program's lock
    around it (see the module docstring).
    """

    device: torch.device

    def _bind(self, kp: KernelProgram, graph: HeteroGraph) -> None:
        self.kp = kp
        self.arrays = graph_arrays(graph, kp.layout, kp.index_bits)
        # one copy on the device, for the kernels' arguments and for folding derived weights next to the params
        self.device_arrays = on_dev = self.arrays.to(self.device)
        self.rows = {d: on_dev.rows(d) for d in ("node", "dst_node", "edge", "src_pair", "dst_pair")}
        self.graph = {n: getattr(on_dev, n).contiguous() for n in GRAPH_ARRAYS if getattr(on_dev, n) is not None}
        # the edge weight is the caller's: a per-run argument (_launch_program), not a constant of the graph
        self.consts = {n: on_dev.graph_constant(n, KERNEL_DTYPE).contiguous() for n in GRAPH_CONSTANTS
                       if n != EDGE_WEIGHT}
        self.loaded: list[_Loaded] = []
        self._host_tables: dict[str, dict[str, torch.Tensor]] = {}  # unit -> its tables on the CPU (for grids)
        self._unit_rows: dict[str, dict[str, int]] = {}  # unit -> its own counts (a weight gradient's chunks)
        self._lock = threading.Lock()  # one run at a time: runs share the program's state

    def _tables(self, u: KernelUnit) -> dict[str, torch.Tensor]:
        k = u.kernel
        host: dict[str, torch.Tensor] = {}
        if isinstance(k, GemmKernel):
            host = gemm_tables(u, self.arrays)
        elif isinstance(k, WeightGradKernel):
            host, self._unit_rows[u.name] = weightgrad_tables(u, self.arrays)
        elif isinstance(k, ScatterKernel) and any(a.kind == "table" for la in u.launches for a in la.args):
            idx = torch.int32 if self.arrays.index_bits == 32 else torch.int64
            perm, off = scatter_groups(k, self.arrays)
            host = {"group_perm": perm.to(idx).contiguous(), "group_off": off.to(idx).contiguous()}
        self._host_tables[u.name] = host
        return {n: t.to(self.device) for n, t in host.items()}

    def _plan(self) -> None:
        """Every launch's grid and fixed arguments (once the units are loaded)."""
        for ld in self.loaded:
            host_tables = self._host_tables[ld.unit.name]  # grids from the CPU tables: no device read per run
            ld.rows = {**self.rows, **self._unit_rows.get(ld.unit.name, {})}
            ld.steps = []
            for launch in ld.unit.launches:
                per_run = tuple((i, a) for i, a in enumerate(launch.args) if _per_run(a))
                values = [0 if _per_run(a) else self._fixed_arg(a, ld.tables, ld.rows) for a in launch.args]
                ld.steps.append(_Step(ld, launch, grid_of(launch.grid, ld.rows, host_tables), values, per_run))
        self._by_name = {ld.unit.name: ld for ld in self.loaded}
        self._reads_edge_weight = any(a.kind == "const" and a.ref == EDGE_WEIGHT
                                      for ld in self.loaded for la in ld.unit.launches for a in la.args)

    def run(self, x: torch.Tensor, params: Mapping[str, torch.Tensor], fill: float | None = None) -> torch.Tensor:
        """The output for input ``x`` (global node order) and ``params``.

        ``fill`` poisons every buffer that is not zero-initialized (NaN in tests: an element a
        kernel forgets to write then shows up in the output). ``x`` and ``params`` are cast to
        float32; the output is float32. Concurrent calls wait for each other.
        """
        with self._lock:
            return self._execute(x, params, fill)

    def run_training(self, x: torch.Tensor, params: Mapping[str, torch.Tensor], dout: torch.Tensor,
                     fill: float | None = None) -> TrainingResult:
        """A training program's ``(output, input gradient, {param: gradient})`` for the output's gradient ``dout``.

        Every key of :attr:`KernelProgram.param_grads` has a gradient, a derived param's included (its
        sources get theirs through the fold: :func:`rgtune.codegen.training.learnable_grads`). The
        gradients are fresh float32 tensors of the params' full shapes; ``fill`` as in :meth:`run`.
        """
        self._training()
        with self._lock:
            return self._execute_training(x, params, dout, fill)

    def run_forward(self, x: torch.Tensor, params: Mapping[str, torch.Tensor],
                    fill: float | None = None) -> tuple[torch.Tensor, Saved]:
        """A training program's forward phase: the output and what its backward phase reads
        (:attr:`KernelProgram.saved` buffers, :attr:`KernelProgram.saved_params` derived params), as
        fresh tensors the caller holds until the backward (several forwards may be in flight)."""
        self._training()
        with self._lock:
            return self._execute_forward(x, params, fill)

    def run_backward(self, x: torch.Tensor, params: Mapping[str, torch.Tensor], saved: Saved, dout: torch.Tensor,
                     fill: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """A training program's backward phase: ``(input gradient, {param: gradient})`` from the forward
        phase's ``saved`` (read, never written) and the output's gradient ``dout``."""
        self._training()
        with self._lock:
            return self._execute_backward(x, params, saved, dout, fill)

    def _training(self) -> KernelProgram:
        if not self.kp.is_training:
            raise BackendError(f"kernel program {self.kp.name} computes no gradients (build a training program)")
        return self.kp

    def _execute(self, x: torch.Tensor, params: Mapping[str, torch.Tensor], fill: float | None = None) -> torch.Tensor:
        """One run, launch by launch (the caller holds the lock); a training program's forward kernels only."""
        bufs, _ = self._launch_program(x, params, "forward", fill)
        return self._rows_of(bufs, self.kp.output)

    def _rows_of(self, bufs: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
        """Buffer ``name`` as ``(rows, width)``: every node's, or the destinations' (a destinations program's
        output: :attr:`~rgtune.ir.plan.LoweringPlan.destinations`)."""
        b = self.kp.buffers[name]
        return bufs[name].view(self.rows[b.domain], b.width)

    def _execute_training(self, x: torch.Tensor, params: Mapping[str, torch.Tensor], dout: torch.Tensor,
                          fill: float | None = None) -> TrainingResult:
        """One training step, both phases in one go, launch by launch (the caller holds the lock)."""
        kp = self.kp
        bufs, p = self._launch_program(x, params, "step", fill, dout)
        grads = {name: p[grad] for name, grad in kp.param_grads.items()}
        dx = self._rows_of(bufs, kp.input_grad) if kp.input_grad is not None else None  # None: params only
        return self._rows_of(bufs, kp.output), dx, grads

    def _execute_forward(self, x: torch.Tensor, params: Mapping[str, torch.Tensor],
                         fill: float | None = None) -> tuple[torch.Tensor, Saved]:
        """The forward phase, launch by launch (the caller holds the lock). Buffers are allocated per call,
        so the saved ones are the caller's already; the output is copied where it is saved too (the
        caller may change the output it gets)."""
        kp = self.kp
        bufs, p = self._launch_program(x, params, "forward", fill)
        out = self._rows_of(bufs, kp.output)
        saved = {b: (bufs[b].clone() if b == kp.output else bufs[b]) for b in kp.saved}
        return out, Saved(saved, {name: p[name] for name in kp.saved_params})

    def _execute_backward(self, x: torch.Tensor, params: Mapping[str, torch.Tensor], saved: Saved,
                          dout: torch.Tensor, fill: float | None = None) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """The backward phase, launch by launch (the caller holds the lock)."""
        kp = self.kp
        missing = [b for b in kp.saved if b not in saved.buffers] + [q for q in kp.saved_params if q not in saved.params]
        if missing:
            raise BackendError(f"the backward phase of {kp.name} reads {', '.join(missing)}: not in the saved values")
        bufs, p = self._launch_program(x, params, "backward", fill, dout, saved)
        dx = self._rows_of(bufs, kp.input_grad) if kp.input_grad is not None else None  # None: params only
        return dx, {name: p[g] for name, g in kp.param_grads.items()}

    def _launch_program(self, x: torch.Tensor, params: Mapping[str, torch.Tensor], phase: str, fill: float | None,
                        dout: torch.Tensor | None = None, saved: Saved | None = None
                        ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Binds a run's buffers and params, then runs the ``phase``'s kernels: ``forward`` (a forward
        program's, or a training program's first ``forward_kernels``), ``backward`` (the rest, on the
        ``saved`` values) or ``step`` (all of a training program's). Returns the buffers and the params."""
        kp, dev = self.kp, self.device
        n = self.rows["node"]
        p = {name: _aligned(t.to(device=dev, dtype=KERNEL_DTYPE)) for name, t in params.items()}
        if self._reads_edge_weight:  # the caller's weight in graph edge order -> layout order
            p[EDGE_WEIGHT] = _aligned(self.device_arrays.edge_weight(p.get(EDGE_WEIGHT), KERNEL_DTYPE))
        x = x.to(device=dev, dtype=KERNEL_DTYPE).reshape(n, x.shape[-1])  # no -1: a graph may have no nodes
        bufs: dict[str, torch.Tensor] = {kp.input: _aligned(x)}
        if saved is not None:
            p.update({name: _aligned(saved.params[name].to(device=dev, dtype=KERNEL_DTYPE))
                      for name in kp.saved_params})
            bufs.update({b: self._saved_buffer(b, saved.buffers[b]) for b in kp.saved})
        if dout is not None:
            assert kp.dout is not None
            b = kp.buffers[kp.dout]
            bufs[kp.dout] = _aligned(dout.to(device=dev, dtype=KERNEL_DTYPE).reshape(self.rows[b.domain], b.width))
            # zeroed: the weight-gradient kernels add their partial sums into them (or overwrite them)
            p.update({grad: torch.zeros(param_full_shape(kp, name, self.arrays), device=dev, dtype=KERNEL_DTYPE)
                      for name, grad in kp.param_grads.items()})
        self._allocate(bufs, fill)
        with self._context():
            for k in self._phase_kernels(phase):
                if isinstance(k, WeightKernel):
                    p[k.out] = _aligned(fold_weights(k, p, self.device_arrays, kp.param_shapes).to(KERNEL_DTYPE))
                    continue
                self._run_unit(self._by_name[k.name], bufs, p)
        return bufs, p

    def _phase_kernels(self, phase: str) -> list[Any]:
        kp = self.kp
        if not kp.is_training or phase == "step":
            return list(kp.kernels)
        return list(kp.kernels[:kp.forward_kernels] if phase == "forward" else kp.kernels[kp.forward_kernels:])

    def _saved_buffer(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """A saved buffer as the backward's kernels read it; a copy where the backward writes it (the
        caller's stays as the forward left it: a second backward on it gets the same)."""
        b = self.kp.buffers[name]
        t = _aligned(t.to(device=self.device, dtype=torch_dtype(b.dtype)).reshape(self.rows[b.domain], b.width))
        return t.clone() if name in self._backward_writes else t

    @property
    def _backward_writes(self) -> set[str]:
        kp = self.kp
        return set().union(*(k.writes() for k in kp.kernels[kp.forward_kernels:])) if kp.is_training else set()

    def _allocate(self, bufs: dict[str, torch.Tensor], fill: float | None) -> None:
        """Every buffer not bound yet: zeroed where the program adds into it, else ``fill`` or uninitialized."""
        for name, b in self.kp.buffers.items():
            if name in bufs:
                continue
            shape, dtype = (self.rows[b.domain], b.width), torch_dtype(b.dtype)  # precision.*: 16-bit rows
            if name in self.kp.zero_init:
                bufs[name] = torch.zeros(shape, device=self.device, dtype=dtype)
            elif fill is not None:
                bufs[name] = torch.full(shape, fill, device=self.device, dtype=dtype)
            else:
                bufs[name] = torch.empty(shape, device=self.device, dtype=dtype)

    def _context(self) -> Any:
        return contextlib.nullcontext()

    def _run_unit(self, ld: _Loaded, bufs: Mapping[str, torch.Tensor], params: Mapping[str, torch.Tensor]) -> None:
        temps = {t.name: torch.full((ld.rows[t.domain], t.width), t.fill, device=self.device, dtype=KERNEL_DTYPE)
                 for t in ld.unit.temps}
        sources = {"buffer": bufs, "param": params, "temp": temps, "const": params}  # const: the edge weight
        for step in ld.steps:
            if 0 in step.grid:
                continue
            args = list(step.values)
            for i, a in step.per_run:
                t = sources[a.kind].get(a.ref)
                if t is None:
                    raise BackendError(f"kernel argument {a.cname}: no {a.kind} {a.ref!r}")
                args[i] = t.data_ptr()
            self._launch(step, args)

    def _launch(self, step: _Step, args: list[int]) -> None:
        raise NotImplementedError

    def _fixed_arg(self, a: Arg, tables: Mapping[str, torch.Tensor], rows: Mapping[str, int]) -> int:
        """A size, or the pointer of a graph array, graph constant or tile table, checked for its dtype."""
        if a.kind == "size":
            return rows[a.ref]
        source = {"graph": self.graph, "const": self.consts, "table": tables}[a.kind]
        if a.ref not in source:
            raise BackendError(f"kernel argument {a.cname}: no {a.kind} {a.ref!r}")
        t = source[a.ref]
        idx = torch.int32 if self.kp.index_bits == 32 else torch.int64
        want = {"const float*": KERNEL_DTYPE, "float*": KERNEL_DTYPE, "const idx_t*": idx}.get(a.ctype)
        if want is not None and t.dtype != want:
            raise BackendError(f"kernel argument {a.cname}: {t.dtype}, expected {want}")
        return t.data_ptr()


def where_recording_failed(stage: str, launched: list[str]) -> str:
    """Where a CUDA graph's recording stopped, for its warning: in which ``stage``, and after which of the kernels
    queued so far (``"unit/function"``; the error is the next operation's, a kernel's or a torch operation's of
    the program: a weight fold, a buffer's initialization).

    Example:
        >>> where_recording_failed("the recording", ["u0/gemm", "u1/edge_softmax"])
        'in the recording, after 2 kernels were queued, the last u1/edge_softmax (the failing operation is the next one)'
        >>> where_recording_failed("the recording", [])
        'in the recording, before its first kernel (a torch operation of the program: a weight fold, a buffer filled)'
    """
    if not launched:
        return f"in {stage}, before its first kernel (a torch operation of the program: a weight fold, a buffer filled)"
    return (f"in {stage}, after {len(launched)} kernel{'s were' if len(launched) > 1 else ' was'} queued, the last "
            f"{launched[-1]} (the failing operation is the next one)")


@dataclass
class _Captured:
    """A run recorded as a CUDA graph: replayed on fixed input buffers, for fixed params."""

    key: tuple[Any, ...]
    graph: Any  # torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]  # x (a backward's dout and saved values too), copied in before each replay
    outputs: Any  # what a run returns, in the graph's memory: the output, a TrainingResult, a phase's
    stream: Any = None  # the torch.cuda.Stream of the last replay


class CudaProgram(ProgramRunner):
    """A generated program loaded on one GPU and bound to one graph: ``run(x, params) -> output``.

    With ``graphs=True`` (the default) the first run records every launch of the program, the
    derived-weight folding and the buffer initialization as one CUDA graph, and later runs
    replay it: the host then pays one replay, not a launch per kernel, which on a small graph
    is most of the time (the kernels of a layer on AIFB take tens of microseconds). A run
    copies ``x`` into the graph's input buffer and returns a copy of its output buffer. Params
    are read through their pointers, so changing them in place (an optimizer step) is seen by
    the next replay; passing other param tensors records the graph again. If recording fails,
    the program warns once and launches kernel by kernel from then on (``graph_failure`` says
    why). ``run(..., fill=...)`` always launches kernel by kernel. Calls from several threads
    run one at a time (see the module docstring).
    """

    def __init__(self, kp: KernelProgram, units: list[KernelUnit], cubins: Mapping[str, Cubin],
                 graph: HeteroGraph, device: torch.device | int | None = None, graphs: bool = True) -> None:
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
        self._plan()
        self.graphs = graphs
        self.graph_failure: str | None = None
        self._captured: _Captured | None = None  # the forward's recording
        self._captured_training: _Captured | None = None  # a training step's
        self._captured_forward: _Captured | None = None  # a training program's forward phase
        self._captured_backward: _Captured | None = None  # and its backward phase
        self._stream = 0
        self._launched: list[str] | None = None  # while recording: the kernels queued so far ("unit/function")

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

    # ---------------------------------------------------------------- running
    def _execute(self, x: torch.Tensor, params: Mapping[str, torch.Tensor], fill: float | None = None) -> torch.Tensor:
        if fill is not None or not self.graphs:
            return self._run_launches(x, params, fill)
        self._captured, out = self._replayed(self._captured, (x,), _graph_key(x, params),
                                             lambda inputs: self._run_launches(inputs[0], params))
        return out

    def _execute_training(self, x: torch.Tensor, params: Mapping[str, torch.Tensor], dout: torch.Tensor,
                          fill: float | None = None) -> TrainingResult:
        """A training step: recorded as a graph of its own (inputs ``x`` and ``dout``), replayed like a run."""
        if fill is not None or not self.graphs:
            return self._run_training_launches(x, params, dout, fill)
        key = _graph_key(x, params) + (tuple(dout.shape),)
        self._captured_training, result = self._replayed(
            self._captured_training, (x, dout), key,
            lambda inputs: self._run_training_launches(inputs[0], params, inputs[1]))
        return result

    def _execute_forward(self, x: torch.Tensor, params: Mapping[str, torch.Tensor],
                         fill: float | None = None) -> tuple[torch.Tensor, Saved]:
        """The forward phase: recorded as a graph of its own, replayed like a run; what it saves is copied
        out of the graph's memory (the caller holds it until the backward)."""
        if fill is not None or not self.graphs:
            return self._launches(super()._execute_forward, x, params, fill)
        self._captured_forward, result = self._replayed(
            self._captured_forward, (x,), _graph_key(x, params),
            lambda inputs: self._launches(super(CudaProgram, self)._execute_forward, inputs[0], params))
        return result

    def _execute_backward(self, x: torch.Tensor, params: Mapping[str, torch.Tensor], saved: Saved,
                          dout: torch.Tensor, fill: float | None = None) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """The backward phase: recorded as a graph of its own whose inputs are ``x``, ``dout`` and the saved
        values (copied in before each replay: every forward's saved tensors are others)."""
        kp = self.kp
        if fill is not None or not self.graphs:
            return self._launches(super()._execute_backward, x, params, saved, dout, fill)
        buffers = [saved.buffers[b] for b in kp.saved]
        derived = [saved.params[q] for q in kp.saved_params]
        inputs = (x, dout, *buffers, *derived)
        nb = len(buffers)

        def run(inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            static = Saved(dict(zip(kp.saved, inputs[2:2 + nb])), dict(zip(kp.saved_params, inputs[2 + nb:])))
            return self._launches(super(CudaProgram, self)._execute_backward, inputs[0], params, static, inputs[1])

        key = _graph_key(x, params) + tuple(tuple(t.shape) for t in inputs[1:])
        self._captured_backward, result = self._replayed(self._captured_backward, inputs, key, run)
        return result

    def _launches(self, phase: Callable[..., Any], *args: Any) -> Any:
        """``phase(*args)`` launch by launch on torch's current stream."""
        self._stream = torch.cuda.current_stream(self.device).cuda_stream
        return phase(*args)

    def _replayed(self, captured: _Captured | None, inputs: tuple[torch.Tensor, ...], key: tuple[Any, ...],
                  run: Callable[[tuple[torch.Tensor, ...]], Any]) -> tuple[_Captured | None, Any]:
        """``run(inputs)`` through ``captured``, recorded first when there is none or ``key`` changed; the
        recording to keep and the result. When recording fails, the launches run one by one."""
        if captured is None or captured.key != key:
            captured = self._capture(inputs, run, key)
            if captured is None:
                return None, run(inputs)
        return captured, self._replay(captured, inputs)

    def _replay(self, captured: _Captured, inputs: tuple[torch.Tensor, ...]) -> Any:
        """``inputs`` through the recorded graph; a copy of its outputs."""
        stream = torch.cuda.current_stream(self.device)
        if captured.stream is not None and captured.stream != stream:
            # the last replay was queued on another stream: it must be done with the inputs and outputs first
            # (on one stream, queue order already says so, and this costs nothing)
            stream.wait_stream(captured.stream)
        captured.stream = stream
        for static, t in zip(captured.inputs, inputs):
            static.copy_(t.reshape(static.shape))
        captured.graph.replay()
        return _cloned(captured.outputs)

    def _run_launches(self, x: torch.Tensor, params: Mapping[str, torch.Tensor],
                      fill: float | None = None) -> torch.Tensor:
        self._stream = torch.cuda.current_stream(self.device).cuda_stream
        return super()._execute(x, params, fill)

    def _run_training_launches(self, x: torch.Tensor, params: Mapping[str, torch.Tensor], dout: torch.Tensor,
                               fill: float | None = None) -> TrainingResult:
        self._stream = torch.cuda.current_stream(self.device).cuda_stream
        return super()._execute_training(x, params, dout, fill)

    def _capture(self, inputs: tuple[torch.Tensor, ...], run: Callable[[tuple[torch.Tensor, ...]], Any],
                 key: tuple[Any, ...]) -> _Captured | None:
        """``run`` recorded on input buffers of its own (copies of ``inputs``, in their shapes: the key has
        them); None when recording fails."""
        # a saved 16-bit buffer (precision.*) keeps its type: the backward's kernels read it so
        static = tuple(torch.empty(tuple(t.shape), device=self.device,
                                   dtype=t.dtype if t.dtype in _LOW_PRECISION else KERNEL_DTYPE) for t in inputs)
        for buffer, t in zip(static, inputs):
            buffer.copy_(t.reshape(buffer.shape))
        stage, self._launched = "its run before the recording", []
        try:
            with torch.cuda.device(self.device):
                # one run first, off the capture: lazy initialization (cuBLAS handles) stays out of the graph
                side = torch.cuda.Stream(self.device)
                side.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(side):
                    run(static)
                torch.cuda.current_stream(self.device).wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                stage, self._launched = "the recording", []
                with torch.cuda.graph(graph), _no_garbage_collection():
                    outputs = run(static)
        except LaunchError:
            raise  # a kernel that cannot launch: the schedule's fault, not the recording's
        except Exception as e:  # noqa: BLE001 - whatever stops the recording, run without a graph
            self.synchronize()  # unless a kernel of the warm-up run faulted: then LaunchError, as without graphs
            self.graphs = False
            where = where_recording_failed(stage, self._launched or [])
            self.graph_failure = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}" \
                                 f"; {where}"
            warnings.warn(f"recording the program as a CUDA graph failed ({self.graph_failure}); "
                          "launching its kernels one by one from now on (a bug: please report it with this line)",
                          RuntimeWarning, stacklevel=4)
            return None
        finally:
            self._launched = None
        return _Captured(key, graph, static, outputs)

    def _context(self) -> Any:
        if torch.cuda.current_device() == self.device.index:
            return contextlib.nullcontext()
        return _cupy().cuda.Device(self.device.index)

    def _launch(self, step: _Step, args: list[int]) -> None:
        if step.state is None:  # the kernel's parameter array, built once: a pointer per 8-byte value
            n = max(len(args), 1)
            values = (ctypes.c_uint64 * n)()
            pointers = (ctypes.c_void_p * n)(*[ctypes.addressof(values) + 8 * i for i in range(n)])
            fn = step.loaded.functions[step.launch.function]
            step.state = (values, pointers, ctypes.addressof(pointers), fn.ptr)
        values, _, params_address, function = step.state
        if self._launched is not None:  # recording a CUDA graph: the kernels queued so far, to say where it failed
            self._launched.append(f"{step.loaded.unit.name}/{step.launch.function}")
        for i, v in enumerate(args):
            values[i] = v
        gx, gy, gz = step.grid
        try:  # the driver copies the parameter values at the call, so the array can be reused at once
            _cupy().cuda.driver.launchKernel(function, gx, gy, gz, step.launch.threads, 1, 1, 0, self._stream,
                                             params_address, 0)
        except Exception as e:  # noqa: BLE001 - CuPy's CUDADriverError and friends
            raise LaunchError(f"{step.loaded.unit.name}/{step.launch.function} grid={step.grid} "
                              f"block={step.launch.threads}: {e}; {STICKY_NOTE}") from e

    def synchronize(self) -> None:
        """Wait for the device; a fault of an earlier launch is raised here as :class:`LaunchError`."""
        try:
            torch.cuda.synchronize(self.device)
        except Exception as e:  # noqa: BLE001 - RuntimeError, or torch.AcceleratorError in newer torch
            raise LaunchError(f"{e}; {STICKY_NOTE}") from e


@contextlib.contextmanager
def _no_garbage_collection() -> Iterator[None]:
    """No cyclic garbage collection inside the block. Collected during a capture, an earlier program
    unloads its module (cuModuleUnload), which a capturing stream forbids: the capture fails and the
    program runs kernel by kernel from then on (seen on an H100 in 3 of ~1,000 trials)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _graph_key(x: torch.Tensor, params: Mapping[str, torch.Tensor]) -> tuple[Any, ...]:
    """What a recorded graph depends on: the input's shape and every param's storage."""
    return (tuple(x.shape),) + tuple((n, t.data_ptr(), t.dtype, tuple(t.shape), t.device)
                                     for n, t in sorted(params.items()))


def _cloned(outputs: Any) -> Any:
    """A copy of a run's outputs (tensors, in tuples, dicts or a :class:`Saved`) out of a recorded graph's memory."""
    if isinstance(outputs, torch.Tensor):
        return outputs.clone()
    if isinstance(outputs, Saved):
        return Saved(_cloned(outputs.buffers), _cloned(outputs.params))
    if isinstance(outputs, dict):
        return {name: _cloned(t) for name, t in outputs.items()}
    return tuple(_cloned(t) for t in outputs)


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
