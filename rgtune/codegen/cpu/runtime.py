"""Binding compiled kernel libraries to a graph, and running them on torch tensors.

:class:`CpuRuntime` prepares once per (program, graph, schedule) everything that depends on
the graph only: the index arrays (:func:`rgtune.ir.bind.graph_arrays`), float32 copies of the
per-edge constants, each GEMM's row order and tiles (cached on the graph, shared by every
program bound to it), and per kernel a ctypes context struct pointing at them. A call then
checks the input and params, folds derived weights with torch, points each context at this
call's tensors (``data_ptr()``, no copies) and calls the kernels in order.

Threads: every kernel runs with ``torch.get_num_threads()`` OpenMP threads (read per call;
torch and the kernels share one libgomp, torch's).

Intermediate buffers live in a workspace allocated on the first call and reused: buffers whose
live intervals do not overlap share memory (:mod:`rgtune.codegen.buffer_plan`; a zeroed one is
zeroed just before its first kernel); the output is a fresh tensor every call, so outputs of two
calls never alias. Every
buffer is allocated as :data:`KERNEL_DTYPE` (float32), never in torch's default dtype: the
kernels write float32 whatever ``torch.set_default_dtype`` says. Inputs and params must be
float32 already; any other dtype is a ``TypeError`` naming the tensor (no silent cast).

Calls from several threads are safe and run one at a time: a runtime has one workspace and
one context struct per kernel, which a call fills with its own pointers, so :meth:`CpuRuntime.run`
holds a lock per runtime. Running calls side by side would gain little, since every call
already spreads its kernels over ``torch.get_num_threads()`` OpenMP threads; a lock costs a
single-threaded caller next to nothing and keeps one workspace. Two runtimes (two layers) run in
parallel: they share only read-only graph arrays.

Training programs (:attr:`KernelProgram.is_training`) run in two phases, as a layer in a model
trains: :meth:`CpuRuntime.run_forward` runs the forward kernels and returns the output and a
:class:`~rgtune.codegen.base.Saved`: the buffers the backward reads (``kp.saved``) and the derived
params the forward folded (``kp.saved_params``), each allocated for the call (never a workspace: the
caller holds them until the backward, and several forwards may be in flight before their backwards).
:meth:`CpuRuntime.run_backward` takes them, the output's gradient ``dout`` (float32, checked like
``x``) and returns the input's gradient and every gradient param (``kp.param_grads``), each a fresh
tensor of the param's full shape. Buffers the program zeroes are zeroed before their first kernel
(the saved ones excepted). The two phases share one planned workspace: a forward's dead buffers and
a backward's never hold values at once. A gradient param is written whole by the first kernel that writes it
(zeros for a type without rows) and added to by the next ones (``accumulate``: a weight used twice);
one whose first writer accumulates starts at zero. :meth:`CpuRuntime.run_training` is the two phases
in a row; :meth:`CpuRuntime.run` of a training program runs its forward kernels alone. A scatter with
``scatter.mapping = owner`` gets its rows grouped by target, a generated weight gradient its row
chunks and groups (both built once per graph and cached like the GEMM tiles).

What runs where:

* generated C (OpenMP): every traversal and map; every GEMM with ``gemm.impl = generated``
  (gather, tiled multiply, bias, epilogue, store or race-free accumulate);
* torch: derived weights (``rgtune.codegen.weights.fold_weights``), and for ``gemm.impl =
  blas`` the gather (``index_select``), one matmul per type segment (MKL) and the scatter of
  an accumulating GEMM (``index_add_``); the bias, epilogue and row store of a BLAS GEMM run
  in its generated ``_finish`` function. A weight gradient with ``weightgrad.impl = blas`` is
  torch's alone: the gather, then ``X_t^T @ DY_t`` per type segment (a bias-like one: ``index_add_``
  of the ``dy`` rows into their types).
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np
import torch

from rgtune.codegen.base import Saved, TrainingResult
from rgtune.codegen.buffer_plan import live_intervals, plan_slots
from rgtune.codegen.cpu.edges import ROW_COUNTS
from rgtune.codegen.cpu.gemm import GemmShape
from rgtune.codegen.cpu.generate import GeneratedProgram, KernelSource
from rgtune.codegen.cpu.memory import POOL
from rgtune.codegen.cpu.rows import GRAPH_CONSTANTS, INDEX_ARRAYS
from rgtune.data._sort import stable_argsort_small
from rgtune.codegen.cpu.schedule import CPU_SCHEDULE
from rgtune.codegen.cpu.weightgrad import WeightGradShape, weightgrad_tables
from rgtune.codegen.reference import param_full_shape
from rgtune.codegen.weights import fold_weights
from rgtune.data.graph import HeteroGraph
from rgtune.ir.bind import GraphArrays, graph_arrays, row_types
from rgtune.ir.passes.precision import torch_dtype
from rgtune.ir.program import EDGE_WEIGHT
from rgtune.ir.kernels import (GemmKernel, KernelProgram, ScatterKernel, TraversalKernel, WeightGradKernel,
                               WeightKernel)

#: owner blocks per thread for accumulating GEMMs (more blocks: better balance, shorter segments)
BLOCKS_PER_THREAD = 4

#: the dtype every generated kernel reads and writes: inputs, params, buffers and scratch
KERNEL_DTYPE = torch.float32


@dataclass
class _BlasGemm:
    """What a BLAS GEMM needs per call: row segments per type, the gather, the scatter."""

    kernel: GemmKernel
    segments: list[tuple[int | None, int, int]]
    gather: torch.Tensor | None  # x row of each ordered row (None: x rows in order already)
    scatter: torch.Tensor | None  # target row of each ordered row (accumulating GEMMs)
    inplace: bool  # staged rows are the output rows themselves
    finish: bool  # whether the generated finish kernel has work
    rows: int
    width: int


@dataclass
class _BlasWeightGrad:
    """What a BLAS weight gradient needs per call: row segments per type, the gathers, the types."""

    kernel: WeightGradKernel
    segments: list[tuple[int, int, int]]  # (type, start, end) in the order
    order: torch.Tensor | None  # dy row of each ordered row (None: rows in order already)
    gather: torch.Tensor | None  # x row of each ordered row (None: the dy order)
    types: torch.Tensor | None  # each dy row's type (a bias-like gradient's index_add_; None: one type)
    num_types: int


@dataclass
class _Bound:
    """One kernel's library bound to the graph: its context struct and how to fill it per call."""

    source: KernelSource
    fn: Any  # the ctypes entry point
    ctx: ctypes.Structure
    ptr: ctypes.c_void_p
    names: set[str]
    scratch: dict[str, str] = field(default_factory=dict)  # field -> workspace name

    def set(self, name: str, value: int) -> None:
        if name in self.names:
            setattr(self.ctx, name, value)

    def call(self) -> None:
        self.fn(self.ptr)


_CTX_TYPES: dict[tuple[tuple[str, str], ...], type[ctypes.Structure]] = {}


def _ctx_type(fields: tuple[tuple[str, str], ...]) -> type[ctypes.Structure]:
    if fields not in _CTX_TYPES:
        _CTX_TYPES[fields] = type("rg_ctx", (ctypes.Structure,), {"_fields_": [
            (n, ctypes.c_void_p if t.endswith("*") else ctypes.c_int64) for n, t in fields]})
    return _CTX_TYPES[fields]


class CpuRuntime:
    """A compiled kernel program bound to one graph: ``run(x, params) -> (num_nodes, out_features)``.

    ``libs`` maps each kernel's name to its loaded library.
    """

    def __init__(self, kp: KernelProgram, graph: HeteroGraph, schedule: Mapping[str, Any], gen: GeneratedProgram,
                 libs: Mapping[str, ctypes.CDLL], blocks: int | None = None) -> None:
        self.kp, self.graph, self.gen = kp, graph, gen
        self.a = graph_arrays(graph, kp.layout, kp.index_bits)
        self.schedule = dict(schedule)
        self.blocks = blocks or BLOCKS_PER_THREAD * max(1, torch.get_num_threads())
        self.keep: list[torch.Tensor] = []  # graph-side arrays the contexts point at
        self.blas: dict[str, _BlasGemm | _BlasWeightGrad] = {}
        self.scratch_shapes: dict[str, tuple[int, ...]] = {}
        self._scratch_of: dict[str, str] = {}  # scratch -> the kernel that uses it
        derived = {k.out for k in kp.kernels if isinstance(k, WeightKernel)} | set(kp.param_grads.values())
        self.param_shapes = {n: param_full_shape(kp, n, self.a) for n in kp.param_shapes if n not in derived}
        #: gradient param -> (full shape, whether it starts at zero: its first writer accumulates)
        self.grad_shapes = {g: (param_full_shape(kp, g, self.a), _first_write_accumulates(kp, g))
                            for g in kp.param_grads.values()}
        self.bound = {src.kernel: self._bind(src, libs[src.kernel]) for src in gen.kernels}
        self._reads_edge_weight = any("G_edge_weight" in b.names for b in self.bound.values())
        for k in kp.kernels:
            if isinstance(k, WeightGradKernel) and k.name not in self.bound:
                self.blas[k.name] = self._blas_weightgrad(k)
        self.steps = self._steps()
        self._plan_workspace()
        self.workspace: dict[str, torch.Tensor] = {}  # planned name -> its view of a slot (first call)
        self._lock = threading.Lock()  # one call at a time: calls share the workspace and the contexts

    def _plan_workspace(self) -> None:
        """Which intermediate buffers and scratch arrays share memory (:mod:`rgtune.codegen.buffer_plan`):
        all but the caller's (input, ``dout``, output, input gradient) and a training program's saved
        buffers (fresh per call). A zeroed buffer is zeroed just before the kernel that first touches
        it, since its slot may hold an earlier buffer's values until then."""
        kp, a = self.kp, self.a
        own = {kp.input, kp.dout, kp.output, kp.input_grad, *kp.saved}
        names = [n for n in kp.buffers if n not in own]
        self._shapes = {n: (a.rows(kp.buffers[n].domain), kp.buffers[n].width) for n in names}
        self._shapes.update(self.scratch_shapes)
        intervals = live_intervals(kp.kernels, names)
        index = {k.name: i for i, k in enumerate(kp.kernels)}
        intervals.update({n: (index[k], index[k]) for n, k in self._scratch_of.items()})
        for j, n in enumerate(n for n in names if n not in intervals):  # touched by no kernel: a slot each
            intervals[n] = (len(kp.kernels) + j, len(kp.kernels) + j)
        self._dtypes = {n: torch_dtype(kp.buffers[n].dtype) if n in kp.buffers else KERNEL_DTYPE for n in intervals}
        # in float32 words: a slot is float32 memory, a 16-bit buffer views it as its own type
        sizes = {n: _words(self._shapes[n], self._dtypes[n]) for n in intervals}
        self._slot_of, self._slot_sizes = plan_slots(intervals, sizes)
        self._zero_at: dict[int, list[str]] = {}
        for n in sorted(kp.zero_init & set(names)):
            self._zero_at.setdefault(intervals[n][0], []).append(n)

    @property
    def workspace_bytes(self) -> int:
        """The memory of the planned workspace (the slots), held from the first call on."""
        return sum(self._slot_sizes) * torch.tensor([], dtype=KERNEL_DTYPE).element_size()

    def _materialize_workspace(self) -> None:
        if self.workspace or not self._slot_of:
            return
        slots = [_kernel_buffer((size,)) for size in self._slot_sizes]
        self.workspace = {n: _typed_view(slots[s], self._dtypes[n], self._shapes[n]) for n, s in self._slot_of.items()}

    def _run_steps(self, lo: int, hi: int, bufs: dict[str, torch.Tensor], params: dict[str, torch.Tensor]) -> None:
        """Kernels ``lo:hi`` in order, zeroing each planned zeroed buffer at its first kernel."""
        for i in range(lo, hi):
            for name in self._zero_at.get(i, ()):
                if name in self.workspace and bufs.get(name) is self.workspace[name]:
                    bufs[name].zero_()
            self.steps[i](bufs, params)

    # ------------------------------------------------------------------ binding
    def _pointer(self, t: torch.Tensor | None) -> int:
        if t is None or t.numel() == 0:
            return 0
        t = t.contiguous()
        self.keep.append(t)
        return t.data_ptr()

    def _bind(self, src: KernelSource, lib: ctypes.CDLL) -> _Bound:
        ctype = _ctx_type(src.fields)
        size = lib.rg_ctx_size
        size.restype = ctypes.c_int64
        if size() != ctypes.sizeof(ctype):
            raise RuntimeError(f"{src.file}: context struct mismatch: C {size()} bytes, ctypes {ctypes.sizeof(ctype)}")
        fn = getattr(lib, src.entry)
        fn.argtypes, fn.restype = [ctypes.c_void_p], None
        ctx = ctype()
        b = _Bound(src, fn, ctx, ctypes.c_void_p(ctypes.addressof(ctx)), {n for n, _ in src.fields})
        a = self.a
        for domain, size_name in ROW_COUNTS.items():
            if size_name in b.names:  # asked only where read: a batch builds its source pairs on first use
                b.set(size_name, a.rows(domain))
        for name in INDEX_ARRAYS:
            if name in b.names:
                b.set(name, self._pointer(getattr(a, name)))
        for kind in GRAPH_CONSTANTS:
            if f"G_{kind}" in b.names and kind != EDGE_WEIGHT:  # the edge weight is the call's (_point)
                b.set(f"G_{kind}", self._pointer(self._cached(("G", kind), lambda: a.graph_constant(kind, KERNEL_DTYPE))))
        k = next(k for k in self.kp.kernels if k.name == src.kernel)
        if isinstance(k, GemmKernel):
            self._bind_gemm(k, b)
        elif isinstance(k, ScatterKernel):
            self._bind_scatter(k, b)
        elif isinstance(k, WeightGradKernel):
            self._bind_weightgrad(k, b)
        elif isinstance(k, TraversalKernel) and "traversal_max" in b.names:
            w = self.kp.buffers[k.stage.out].width  # type: ignore[attr-defined]
            # one row per softmax group: a destination, or a destination pair (a softmax per relation)
            groups = a.num_nodes if getattr(k.stage, "group", "dst") == "dst" else a.rows("dst_pair")
            for part in ("max", "sum"):
                b.scratch[f"traversal_{part}"] = f"{k.name}_{part}"
                self.scratch_shapes[f"{k.name}_{part}"] = (groups * w,)
                self._scratch_of[f"{k.name}_{part}"] = k.name
        return b

    def _bind_gemm(self, k: GemmKernel, b: _Bound) -> None:
        s = CPU_SCHEDULE.kernel_schedule(k, self.schedule)
        if s["impl"] == "generated":
            order, tiles, groups = self._cached(("tiles", k.rows, k.by, k.weight_end, k.out_via if k.accumulate else None,
                                                 int(s["tile_rows"]), self.blocks), lambda: self._tiles(k, int(s["tile_rows"])))
            b.set("gemm_order", self._pointer(order))
            b.set("gemm_tiles", self._pointer(tiles))
            b.set("gemm_groups", self._pointer(groups))
            b.set("gemm_ngroups", groups.numel() - 1)
            return
        order, sorted_types, segments, gather, scatter, identity = self._cached(
            ("blas", k.rows, k.by, k.weight_end, k.x_via, k.out_via if k.accumulate else None), lambda: self._segments(k))
        n = order.numel()
        # torch multiplies into float32: a row stored in another type is converted by the finish step
        inplace = identity and not k.accumulate and k.out is not None and self.kp.buffers[k.out].dtype == "float32"
        copy = not k.accumulate and k.out is not None and not inplace
        nout = k.out_heads * k.out_dim
        self.blas[k.name] = _BlasGemm(k, segments, gather, scatter, inplace, bool(k.bias or k.epilogue or copy), n, nout)
        b.set("gemm_order", self._pointer(order))
        b.set("gemm_types", self._pointer(sorted_types))
        b.set("gemm_rows", n)
        b.set("gemm_inplace", int(inplace))
        if not inplace:
            self.scratch_shapes[f"{k.name}_staged"] = (n, nout)
            self._scratch_of[f"{k.name}_staged"] = k.name

    def _bind_scatter(self, k: ScatterKernel, b: _Bound) -> None:
        """``owner``: the rows grouped by target (a permutation and the targets' offsets into it)."""
        if "scatter_perm" not in b.names:
            return  # atomic: rows in their own order
        perm, offsets = self._cached(("scatter", k.rows, k.out_via), lambda: self._by_target(k))
        b.set("scatter_perm", self._pointer(perm))
        b.set("scatter_offsets", self._pointer(offsets))

    def _by_target(self, k: ScatterKernel) -> tuple[torch.Tensor, torch.Tensor]:
        target = row_index(self.a, k.rows, k.out_via).numpy()
        count = self.a.num_nodes if k.out_via in ("src", "pair_node") else self.a.rows("src_pair")
        perm = stable_argsort_small(torch.from_numpy(target), count).numpy()
        offsets = np.searchsorted(target[perm], np.arange(count + 1)).astype(np.int64)
        idx = np.int32 if self.kp.index_bits == 32 else np.int64
        return torch.from_numpy(perm.astype(idx)), torch.from_numpy(offsets)

    def _num_types(self, by: str) -> int:
        return {"ntype": self.a.num_ntypes, "rel": self.a.num_rels}.get(by, 1)

    def _bind_weightgrad(self, k: WeightGradKernel, b: _Bound) -> None:
        """Row order, chunks and groups (per graph, cached), and the split reduction's partials (workspace)."""
        s = CPU_SCHEDULE.kernel_schedule(k, self.schedule)
        nt, ch = self._num_types(k.by), int(s["chunk_rows"])

        def make() -> tuple[torch.Tensor, ...]:
            types = row_types(self.a, k.rows, k.by, k.weight_end)
            tables = weightgrad_tables(None if types is None else types.numpy(), self.a.rows(k.rows), ch, nt,
                                       self.blocks)
            idx = np.int32 if self.kp.index_bits == 32 else np.int64
            return (torch.from_numpy(tables[0].astype(idx)), *(torch.from_numpy(t) for t in tables[1:]))

        order, chunks, groups, type_groups = self._cached(("weightgrad", k.rows, k.by, k.weight_end, ch, self.blocks),
                                                          make)
        for name, t in (("order", order), ("chunks", chunks), ("groups", groups), ("type_groups", type_groups)):
            b.set(f"weightgrad_{name}", self._pointer(t))
        b.set("weightgrad_ngroups", groups.numel() - 1)
        b.set("weightgrad_ntypes", nt)
        if "weightgrad_partial" in b.names:
            b.scratch["weightgrad_partial"] = f"{k.name}_partial"
            wsize = WeightGradShape.of(k, self.kp).wsize
            self.scratch_shapes[f"{k.name}_partial"] = ((groups.numel() - 1) * wsize,)
            self._scratch_of[f"{k.name}_partial"] = k.name

    def _blas_weightgrad(self, k: WeightGradKernel) -> _BlasWeightGrad:
        """The per-type segments of a BLAS weight gradient (cached per graph) and what it gathers."""
        a = self.a
        n, nt = a.rows(k.rows), self._num_types(k.by)

        def make() -> tuple[Any, ...]:
            types = row_types(a, k.rows, k.by, k.weight_end)
            t = np.zeros(n, np.int64) if types is None else types.numpy()
            order = np.argsort(t, kind="stable")
            bounds = np.searchsorted(t[order], np.arange(nt + 1)).tolist()
            segments = [(ty, bounds[ty], bounds[ty + 1]) for ty in range(nt) if bounds[ty + 1] > bounds[ty]]
            identity = bool(np.array_equal(order, np.arange(n)))
            return (segments, None if identity else torch.from_numpy(order), order,
                    None if types is None else types.contiguous())

        segments, order, order_np, types = self._cached(("blas_weightgrad", k.rows, k.by, k.weight_end), make)
        gather = None
        if k.x is not None and not (k.x_via == "row" and order is None):
            gather = self._cached(("blas_weightgrad_x", k.rows, k.by, k.weight_end, k.x_via),
                                  lambda: torch.from_numpy(row_index(a, k.rows, k.x_via).numpy()[order_np]))
        return _BlasWeightGrad(k, segments, order, gather, types, nt)

    def _cached(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        """Per-graph arrays, shared by every program bound to the graph with the same layout and width."""
        cache = self.graph.__dict__.setdefault("_rgtune_cpu_bind", {})
        key = (self.kp.layout, self.kp.index_bits) + key
        if key not in cache:
            cache[key] = make()
        return cache[key]

    def _tiles(self, k: GemmKernel, tile_rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a = self.a
        n = a.rows(k.rows)
        types = row_types(a, k.rows, k.by, k.weight_end)
        block = owner_blocks(row_index(a, k.rows, k.out_via), self.blocks) if k.accumulate else None
        order, tiles, groups = gemm_tiles(None if types is None else types.numpy(), tile_rows,
                                          None if block is None else block, n)
        idx = np.int32 if self.kp.index_bits == 32 else np.int64
        return torch.from_numpy(order.astype(idx)), torch.from_numpy(tiles), torch.from_numpy(groups)

    def _segments(self, k: GemmKernel) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int | None, int, int]],
                                                 torch.Tensor | None, torch.Tensor | None, bool]:
        """Row order by type, each ordered row's type, the type segments, the gather and scatter rows,
        and whether the order is the identity (then the output rows can be the matmul's output)."""
        a = self.a
        n = a.rows(k.rows)
        types = row_types(a, k.rows, k.by, k.weight_end)
        if types is None:
            order, sorted_types, segments = np.arange(n), np.zeros(n, np.int64), [(None, 0, n)]
        else:
            t = types.numpy()
            order = np.argsort(t, kind="stable")
            sorted_types = t[order]
            bounds = np.searchsorted(sorted_types, np.arange(int(t.max(initial=0)) + 2)).tolist()
            segments = [(ty, bounds[ty], bounds[ty + 1]) for ty in range(len(bounds) - 1) if bounds[ty + 1] > bounds[ty]]
        identity = bool(np.array_equal(order, np.arange(n)))
        gather = None if (k.x_via == "row" and identity) else torch.from_numpy(row_index(a, k.rows, k.x_via).numpy()[order])
        scatter = torch.from_numpy(row_index(a, k.rows, k.out_via).numpy()[order]) if k.accumulate else None
        idx = np.int32 if self.kp.index_bits == 32 else np.int64
        return (torch.from_numpy(order.astype(idx)), torch.from_numpy(np.ascontiguousarray(sorted_types, np.int64)),
                segments, gather, scatter, identity)

    def _steps(self) -> list[Callable[[dict[str, torch.Tensor], dict[str, torch.Tensor]], None]]:
        steps = []
        for k in self.kp.kernels:
            blas = self.blas.get(k.name)
            if isinstance(k, WeightKernel):
                steps.append(self._fold_step(k))
            elif isinstance(blas, _BlasWeightGrad):
                steps.append(self._blas_weightgrad_step(blas))
            elif isinstance(blas, _BlasGemm):
                steps.append(self._blas_step(blas))
            else:
                steps.append(self._c_step(self.bound[k.name]))
        return steps

    def _c_step(self, b: _Bound) -> Callable[..., None]:
        pack = self._bf16_pairs(b) if "gemm_wpk" in b.names else None

        def step(bufs: dict[str, torch.Tensor], params: dict[str, torch.Tensor]) -> None:
            self._point(b, bufs, params)
            if pack is not None:  # the weights change every optimizer step: packed every call (they are small)
                packed = pack(params)
                b.set("gemm_wpk", _ptr(packed))
            b.call()
        return step

    def _bf16_pairs(self, b: _Bound) -> Callable[[Mapping[str, torch.Tensor]], torch.Tensor]:
        """How a bfloat16 GEMM's weight is packed for its dot products: per type and head, ``[k / 2][n][2]``
        (the two weights of a column for a pair of inputs side by side; :func:`~.gemm.bf16_micro_kernel`)."""
        k = next(k for k in self.kp.kernels if k.name == b.source.kernel)
        assert isinstance(k, GemmKernel)
        shape = GemmShape.of(k, self.kp)

        def pack(params: Mapping[str, torch.Tensor]) -> torch.Tensor:
            w = params[k.weight].reshape(-1, shape.heads, shape.k // 2, 2, shape.n)
            return w.transpose(3, 4).to(torch.bfloat16).contiguous()
        return pack

    def _point(self, b: _Bound, bufs: dict[str, torch.Tensor], params: dict[str, torch.Tensor]) -> None:
        """This call's tensors into ``b``'s context (pointers only; nothing is copied)."""
        b.set("num_threads", torch.get_num_threads())
        for canon, name in b.source.buffers.items():
            b.set(canon, _ptr(bufs[name]))
        for canon, name in b.source.params.items():
            b.set(f"P_{canon}", _ptr(params[name]))
        for fld, ws in b.scratch.items():
            b.set(fld, _ptr(self.workspace[ws]))
        if "G_edge_weight" in b.names:  # the caller's per-edge weight, in layout order (_check_params)
            b.set("G_edge_weight", _ptr(params[EDGE_WEIGHT]))

    def _fold_step(self, k: WeightKernel) -> Callable[..., None]:
        def step(bufs: dict[str, torch.Tensor], params: dict[str, torch.Tensor]) -> None:
            params[k.out] = fold_weights(k, params, self.a, self.kp.param_shapes).to(KERNEL_DTYPE).contiguous()
        return step

    def _blas_step(self, g: _BlasGemm) -> Callable[..., None]:
        k, b = g.kernel, self.bound[g.kernel.name]

        def step(bufs: dict[str, torch.Tensor], params: dict[str, torch.Tensor]) -> None:
            x = bufs[k.x].view(-1, self.kp.buffers[k.x].width)
            xg = _as_float(x if g.gather is None else x.index_select(0, g.gather))
            staged = bufs[k.out].view(-1, g.width) if g.inplace else self.workspace[f"{k.name}_staged"]
            w = params[k.weight]
            for t, s, e in g.segments:
                wt = w if t is None else w[t]
                if k.per_head:  # (n, H, Din) x (H, Din, Dout) -> (n, H, Dout)
                    res = torch.bmm(xg[s:e].view(e - s, k.in_heads, k.in_dim).transpose(0, 1), wt)
                    staged[s:e].view(e - s, k.out_heads, k.out_dim).copy_(res.transpose(0, 1))
                else:
                    torch.matmul(xg[s:e], wt, out=staged[s:e])
            if g.finish:
                self._point(b, bufs, params)
                b.set("gemm_staged", _ptr(staged))
                b.call()
            if g.scatter is not None:
                bufs[k.out].view(-1, g.width).index_add_(0, g.scatter, staged)  # type: ignore[index]
        return step

    def _blas_weightgrad_step(self, g: _BlasWeightGrad) -> Callable[..., None]:
        k = g.kernel
        shape = self.kp.param_shapes[k.grad]

        def step(bufs: dict[str, torch.Tensor], params: dict[str, torch.Tensor]) -> None:
            dy = _as_float(bufs[k.dy].view(-1, self.kp.buffers[k.dy].width))
            grad = params[k.grad].view(g.num_types, -1)
            if not k.accumulate:
                grad.zero_()  # a type without rows has a zero gradient
            if k.x is None:  # a bias-like gradient: the dy rows summed per type
                if g.types is None:
                    grad[0].add_(dy.sum(0))
                else:
                    grad.index_add_(0, g.types, dy)
                return
            x = bufs[k.x].view(-1, self.kp.buffers[k.x].width)
            xg = _as_float(x if g.gather is None else x.index_select(0, g.gather))
            dyo = dy if g.order is None else dy.index_select(0, g.order)
            for t, s, e in g.segments:
                gt = grad[t].view(shape)
                if k.per_head:  # (H, K, n) x (H, n, N) -> (H, K, N)
                    xs = xg[s:e].view(e - s, k.in_heads, k.in_dim).permute(1, 2, 0)
                    gt.baddbmm_(xs, dyo[s:e].view(e - s, k.out_heads, k.out_dim).transpose(0, 1))
                else:
                    gt.addmm_(xg[s:e].t(), dyo[s:e])
        return step

    # ------------------------------------------------------------------ running
    def run(self, x: torch.Tensor, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The layer's output ``(rows, out_features)`` (every node's, or a destinations program's destinations') for input ``x`` and learnable ``params``
        (float32 CPU tensors); of a training program, its forward kernels alone. Concurrent calls wait
        for each other (see the module docstring)."""
        with self._lock, torch.no_grad():
            x = self._check_input(x)
            p = self._check_params(params)
            bufs = self._buffers(x, fresh=set(self.kp.saved))
            end = len(self.steps) if self.kp.forward_kernels is None else self.kp.forward_kernels
            self._run_steps(0, end, bufs, p)
            return self._rows_of(bufs, self.kp.output)

    def run_training(self, x: torch.Tensor, params: Mapping[str, torch.Tensor], dout: torch.Tensor) -> TrainingResult:
        """A training program's ``(output, input gradient, {param: gradient})`` for input ``x``, learnable
        ``params`` and the output's gradient ``dout`` (float32 CPU tensors): :meth:`run_forward` then
        :meth:`run_backward`. Every returned tensor is this call's own."""
        out, saved = self.run_forward(x, params)
        dx, grads = self.run_backward(x, params, saved, dout)
        return out, dx, grads

    def run_forward(self, x: torch.Tensor, params: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, Saved]:
        """A training program's forward phase: the output and what its backward reads (the buffers of
        ``kp.saved`` and the derived params of ``kp.saved_params``), all fresh tensors of this call: the
        caller holds them until the backward, and several forwards may be in flight before theirs."""
        kp = self._training()
        with self._lock, torch.no_grad():
            x = self._check_input(x)
            p = self._check_params(params)
            bufs = self._buffers(x, fresh=set(kp.saved))
            self._run_steps(0, kp.forward_kernels, bufs, p)  # type: ignore[arg-type]
            saved = Saved({b: bufs[b] for b in kp.saved}, {q: p[q] for q in kp.saved_params})
            return self._rows_of(bufs, kp.output), saved

    def run_backward(self, x: torch.Tensor, params: Mapping[str, torch.Tensor], saved: Saved,
                     dout: torch.Tensor) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """A training program's backward phase: ``(input gradient, {param: gradient})`` from the forward's
        ``saved`` (read, not recomputed) and the output's gradient ``dout``. The gradients are fresh
        tensors of the params' full shapes (the caller keeps them)."""
        kp = self._training()
        with self._lock, torch.no_grad():
            x = self._check_input(x)
            p = self._check_params(params)
            dout = self._check_input(dout, "dout", kp.dout)
            given = self._check_saved(saved)
            p.update(saved.params)
            for g, (shape, zero) in self.grad_shapes.items():
                p[g] = _kernel_buffer(shape, zero)  # fresh: the caller keeps the gradients
            bufs = self._buffers(x, dout, given)
            self._run_steps(kp.forward_kernels, len(self.steps), bufs, p)  # type: ignore[arg-type]
            grads = {name: p[g] for name, g in kp.param_grads.items()}
            dx = self._rows_of(bufs, kp.input_grad) if kp.input_grad is not None else None  # None: params only
            return dx, grads

    def _training(self) -> KernelProgram:
        if not self.kp.is_training:
            raise ValueError(f"kernel program {self.kp.name} computes no gradients (compile it with training=True)")
        return self.kp

    def _check_saved(self, saved: Saved) -> dict[str, torch.Tensor]:
        """The saved buffers (checked: every one of ``kp.saved``, float32, its shape) and derived params."""
        kp, a = self.kp, self.a
        if not isinstance(saved, Saved):
            raise TypeError(f"saved must be the Saved of run_forward, got {type(saved).__name__}")
        missing = sorted(set(kp.saved) - set(saved.buffers)) + sorted(set(kp.saved_params) - set(saved.params))
        if missing:
            raise KeyError(f"saved lacks {missing}; the backward reads {sorted(kp.saved + kp.saved_params)}")
        out = {}
        for name in kp.saved:
            b = kp.buffers[name]
            t = saved.buffers[name]
            _check_tensor(f"saved buffer {name!r}", t, (a.rows(b.domain), b.width), torch_dtype(b.dtype))
            out[name] = t.contiguous()
        for name in kp.saved_params:
            _check_tensor(f"saved param {name!r}", saved.params[name], tuple(saved.params[name].shape))
        return out

    def _rows_of(self, bufs: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
        """Buffer ``name`` as ``(rows, width)``: every node's, or the destinations' (a destinations program's
        output: :attr:`~rgtune.ir.plan.LoweringPlan.destinations`)."""
        b = self.kp.buffers[name]
        return bufs[name].view(self.a.rows(b.domain), b.width)

    def _check_input(self, x: torch.Tensor, what: str = "input x", buffer: str | None = None) -> torch.Tensor:
        b = self.kp.buffers[buffer or self.kp.input]
        _check_tensor(what, x, (self.a.rows(b.domain), b.width))
        return x.contiguous()

    def _check_params(self, params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {}
        for name, shape in self.param_shapes.items():
            if name not in params:
                raise KeyError(f"missing param {name!r}; the program needs {sorted(self.param_shapes)}")
            t = params[name]
            _check_tensor(f"param {name!r}", t, shape)
            out[name] = t.detach().contiguous()
        if self._reads_edge_weight:  # the caller's weight in graph edge order -> layout order, float32
            w = params.get(EDGE_WEIGHT)
            if w is not None and w.device.type != "cpu":
                raise ValueError(f"edge_weight is on {w.device}; the cpu backend needs CPU tensors (call .cpu())")
            out[EDGE_WEIGHT] = self.a.edge_weight(w, KERNEL_DTYPE).contiguous()
        return out

    def _buffers(self, x: torch.Tensor, dout: torch.Tensor | None = None,
                 given: Mapping[str, torch.Tensor] | None = None,
                 fresh: set[str] | frozenset[str] = frozenset()) -> dict[str, torch.Tensor]:
        """This call's buffers: the input, ``dout``, the ``given`` (a backward's saved ones), and the rest:
        the output, the input's gradient and the ``fresh`` ones (a forward's saved ones) allocated for
        the call (zeroed where the program says so), the others views of the planned workspace (zeroed
        at their first kernel: :meth:`_run_steps`)."""
        kp, a = self.kp, self.a
        self._materialize_workspace()
        bufs = {kp.input: x, **(given or {})}
        if kp.dout is not None and dout is not None:
            bufs[kp.dout] = dout
        for name, b in kp.buffers.items():
            if name in bufs:
                continue
            if name in self.workspace and name not in fresh:
                bufs[name] = self.workspace[name]
                continue
            # the caller's (output, input gradient, saved ones): never a workspace alias
            bufs[name] = _kernel_buffer((a.rows(b.domain), b.width), name in kp.zero_init, torch_dtype(b.dtype))
        return bufs


def _first_write_accumulates(kp: KernelProgram, grad: str) -> bool:
    """Whether the first kernel writing gradient param ``grad`` adds to it (then it must start at zero)."""
    for k in kp.kernels:
        if isinstance(k, WeightGradKernel) and k.grad == grad:
            return k.accumulate
    return True  # written by no kernel: its gradient is zero


def _kernel_buffer(shape: tuple[int, ...], zero: bool = False, dtype: torch.dtype = KERNEL_DTYPE) -> torch.Tensor:
    """A buffer the kernels write: :data:`KERNEL_DTYPE` whatever torch's default dtype is (or the 16-bit type
    a precision knob chose for it); a big one on the pool's already mapped memory (:mod:`.memory`: no page
    faults for each batch's new buffers)."""
    if dtype == KERNEL_DTYPE:
        return POOL.tensor(shape, KERNEL_DTYPE, zero)
    return _typed_view(POOL.tensor((_words(shape, dtype),), KERNEL_DTYPE, zero), dtype, shape)


def _words(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """The float32 words that hold ``shape`` elements of ``dtype`` (rounded up)."""
    return -(-int(np.prod(shape)) * dtype.itemsize // KERNEL_DTYPE.itemsize)


def _as_float(t: torch.Tensor) -> torch.Tensor:
    """``t`` for torch's float32 matmuls: a 16-bit buffer's rows converted (a copy), a float32 one as it is."""
    return t if t.dtype == KERNEL_DTYPE else t.float()


def _typed_view(words: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """The first ``prod(shape)`` elements of ``dtype`` in the float32 memory ``words`` (1-d), as ``shape``."""
    n = int(np.prod(shape))
    flat = words if dtype == KERNEL_DTYPE else words.view(dtype)
    return flat[:n].view(shape)


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr() if t.numel() else 0


def _check_tensor(what: str, t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype = KERNEL_DTYPE) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{what} is on {t.device}; the cpu backend needs CPU tensors (call .cpu())")
    if t.dtype != dtype:
        if dtype == KERNEL_DTYPE:
            raise TypeError(f"{what} has dtype {t.dtype}; the cpu backend computes in {KERNEL_DTYPE} (call .float())")
        raise TypeError(f"{what} has dtype {t.dtype}; this program stores it as {dtype} (call .to({dtype}))")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{what} must have shape {tuple(shape)}, got {tuple(t.shape)}")


# ---------------------------------------------------------------- graph-side arrays


def row_index(a: GraphArrays, rows: str, via: str) -> torch.Tensor:
    """The row in another domain that each row reaches through ``via`` (int64)."""
    if via == "row":
        return torch.arange(a.rows(rows))
    table = {("edge", "src"): "e_src", ("edge", "dst"): "e_dst", ("edge", "src_pair"): "e_sp",
             ("edge", "dst_pair"): "e_dp", ("src_pair", "pair_node"): "sp_node", ("dst_pair", "pair_node"): "dp_node"}
    if (rows, via) not in table:
        raise ValueError(f"no index {via!r} on {rows} rows")
    return getattr(a, table[(rows, via)]).long()


def owner_blocks(target: torch.Tensor, blocks: int) -> np.ndarray:
    """Split the target rows into ``blocks`` ranges of about equal row counts; each row's block."""
    t = target.numpy()
    if t.size == 0:
        return np.zeros(0, np.int64)
    ranked = np.sort(t)
    cuts = ranked[(np.arange(1, blocks) * t.size) // blocks]
    return np.searchsorted(cuts, t, side="right").astype(np.int64)


def gemm_tiles(types: np.ndarray | None, tile_rows: int, block: np.ndarray | None,
               n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row order, tiles ``(start, end, type)`` and work groups (tile ranges) of a tiled GEMM.

    Rows are sorted by (owner block, type), stably; a tile is at most ``tile_rows`` rows of
    one type and block. Without blocks every tile is its own work group; with blocks a group
    is a block, so one thread does all rows whose accumulation targets lie in it.

    >>> order, tiles, groups = gemm_tiles(np.array([1, 0, 1, 1]), 2, None, 4)
    >>> order.tolist(), tiles.tolist(), groups.tolist()
    ([1, 0, 2, 3], [[0, 1, 0], [1, 3, 1], [3, 4, 1]], [0, 1, 2, 3])
    """
    types = np.zeros(n, np.int64) if types is None else types.astype(np.int64)
    key = types if block is None else block * (int(types.max(initial=0)) + 1) + types
    order = np.argsort(key, kind="stable")
    if n == 0:
        return order, np.zeros((0, 3), np.int64), np.zeros(1, np.int64)
    skey = key[order]
    run_start = np.flatnonzero(np.concatenate([[True], skey[1:] != skey[:-1]]))
    run_end = np.append(run_start[1:], n)
    count = (run_end - run_start + tile_rows - 1) // tile_rows
    run = np.repeat(np.arange(run_start.size), count)
    first = np.cumsum(count) - count
    start = run_start[run] + (np.arange(run.size) - first[run]) * tile_rows
    end = np.minimum(start + tile_rows, run_end[run])
    tiles = np.ascontiguousarray(np.stack([start, end, types[order][start]], 1), np.int64)
    if block is None:
        groups = np.arange(tiles.shape[0] + 1, dtype=np.int64)
    else:
        groups = np.searchsorted(block[order][start], np.arange(int(block.max()) + 2)).astype(np.int64)
    return order, tiles, groups
