"""The ``cuda`` target's schedule knobs and the launch limits they must respect.

Read by :mod:`._gemm` (block tile, K slice, threads, block partition), :mod:`._traversal`
(mapping, threads, vector width (:func:`vector_width`), coarsening), :mod:`._map` (threads), and, in a training
program, :mod:`._scatter` (mapping, threads, vector width, coarsening) and :mod:`._weightgrad`
(reduction, row chunk, gradient tile, threads). The limits are checked before anything is
compiled, so an impossible point is recorded as invalid, not built: a GEMM block's (or a weight
gradient block's) two shared-memory tiles must fit the static shared memory a block may use
without opting in (:data:`MAX_STATIC_SHARED`, also what :mod:`.nvrtc` checks ptxas's report
against), and each thread computes between 1 and 64 outputs (more spills registers).

Example:
    >>> list(CUDA_SCHEDULE.knobs())[:3]
    ['gemm.tile_rows', 'gemm.tile_cols', 'gemm.tile_k']
    >>> from rgtune.ir.kernels import GemmKernel
    >>> gemm_resources({"tile_rows": 128, "tile_cols": 64, "tile_k": 32, "threads": 64}, GemmKernel("g"))
    '128 outputs per thread > 64 (register pressure)'
"""

from __future__ import annotations

from typing import Any, Mapping

from rgtune.codegen.schedule import (MAPPING_CONSTRAINT, TRAVERSAL_MAPPING, ScheduleConstraint, ScheduleParam,
                                     TargetSchedule, TemplateSchedule)
from rgtune.ir.kernels import GemmKernel, Kernel, MapKernel, ScatterKernel, TraversalKernel, WeightGradKernel
from rgtune.ir.passes.precision import STORAGE_TYPES

#: hardware limits shared by every architecture rgtune compiles for (sm_80, sm_90) that a launch must respect
MAX_THREADS_PER_BLOCK = 1024
MAX_REGISTERS_PER_BLOCK = 65536
#: static shared memory per block without an opt-in
MAX_STATIC_SHARED = 48 * 1024
#: outputs one GEMM thread may accumulate before registers spill
MAX_OUTPUTS_PER_THREAD = 64


def gemm_resources(s: Mapping[str, Any], k: Kernel) -> str | None:
    """Why a GEMM tile does not fit a block (shared memory, registers, threads), or None."""
    smem = (s["tile_rows"] * s["tile_k"] + s["tile_k"] * s["tile_cols"]) * 4
    if smem > MAX_STATIC_SHARED:
        return f"shared memory {smem} B > {MAX_STATIC_SHARED // 1024} KiB"
    outputs_per_thread = s["tile_rows"] * s["tile_cols"] / s["threads"]
    if outputs_per_thread > MAX_OUTPUTS_PER_THREAD:
        return f"{outputs_per_thread:g} outputs per thread > {MAX_OUTPUTS_PER_THREAD} (register pressure)"
    if outputs_per_thread < 1:
        return f"fewer outputs ({s['tile_rows'] * s['tile_cols']}) than threads ({s['threads']})"
    return None


def weightgrad_resources(s: Mapping[str, Any], k: Kernel) -> str | None:
    """Why a weight gradient's tile does not fit a block, or None. The tiles matter for ``x^T dy`` only: a
    bias's gradient (a column sum, ``x`` None) has no tile."""
    assert isinstance(k, WeightGradKernel)
    if k.x is None:
        return None
    if s["chunk_rows"] % s["tile_r"]:
        return f"row chunk {s['chunk_rows']} is not a multiple of the row slice {s['tile_r']}"
    return gemm_resources({"tile_rows": s["tile_m"], "tile_cols": s["tile_n"], "tile_k": s["tile_r"],
                           "threads": s["threads"]}, k)


def vector_width(s: Mapping[str, Any], k: Kernel) -> int:
    """The features per thread a traversal or a scatter uses: its ``vector_width`` knob, halved until it divides
    the kernel's feature size. An upper bound rather than a constraint: one knob serves a program's kernels of
    several sizes (an attention's single-score traversals and scatters beside its messages' rows), and as a
    constraint the score kernels would hold every other kernel of the program at width 1.

    >>> from rgtune.ir.kernels import Acc
    >>> vector_width({"vector_width": 4}, ScatterKernel("s", message=Acc(2, 6)))
    2
    """
    if isinstance(k, ScatterKernel):
        dim = k.message.dim
    else:
        assert isinstance(k, TraversalKernel)
        dim = k.stage.feature_dim()
    v = s.get("vector_width", 1)
    while v > 1 and dim % v:
        v //= 2
    return v


CUDA_SCHEDULE = TargetSchedule("cuda", [
    TemplateSchedule(GemmKernel, (
        ScheduleParam("tile_rows", (16, 32, 64, 128), 64, "block tile M (rows per block tile)"),
        ScheduleParam("tile_cols", (16, 32, 64), 32, "block tile N (output columns per block tile)"),
        ScheduleParam("tile_k", (8, 16, 32), 16, "K slice staged in shared memory"),
        ScheduleParam("threads", (64, 128, 256), 128, "threads per block"),
        ScheduleParam("block_partition", ("static", "balanced"), "balanced",
                      "blocks per segment (static: one tile grid per type; balanced: tiles over all rows)"),
    ), (ScheduleConstraint("cuda_resources", gemm_resources),)),
    TemplateSchedule(TraversalKernel, (
        TRAVERSAL_MAPPING,
        ScheduleParam("threads", (32, 64, 128, 256), 128, "threads per block"),
        ScheduleParam("vector_width", (1, 2, 4), 1,
                      "features per thread, at most (float, float2, float4; halved where it does not divide a size)"),
        ScheduleParam("coarsening", (1, 2, 4), 1, "destinations (or edges) per warp"),
    ), (MAPPING_CONSTRAINT,)),
    TemplateSchedule(MapKernel, (
        ScheduleParam("threads", (64, 128, 256), 256, "threads per block"),
    )),
    # a training program's templates (appended: the knobs above keep their order)
    TemplateSchedule(ScatterKernel, (
        ScheduleParam("mapping", ("src_parallel", "edge_parallel"), "src_parallel",
                      "a warp per target row over its rows, grouped by a host-built permutation (no atomics), "
                      "or a thread per (row, feature chunk) with atomicAdd"),
        ScheduleParam("threads", (32, 64, 128, 256), 128, "threads per block"),
        ScheduleParam("vector_width", (1, 2, 4), 1,
                      "features per thread, at most (float, float2, float4; halved where it does not divide a size)"),
        ScheduleParam("coarsening", (1, 2, 4), 1, "targets per warp (src_parallel) or rows per thread"),
    )),
    TemplateSchedule(WeightGradKernel, (
        ScheduleParam("reduction", ("atomic", "two_pass"), "atomic",
                      "how the row chunks' partial gradients combine: atomicAdd into the gradient, or a "
                      "partials buffer summed by a second kernel (deterministic)"),
        ScheduleParam("chunk_rows", (128, 512, 2048), 512, "rows of one type reduced by one block"),
        ScheduleParam("tile_m", (16, 32, 64), 32, "gradient tile rows (input features) per block"),
        ScheduleParam("tile_n", (16, 32, 64), 64, "gradient tile columns (output features) per block"),
        ScheduleParam("tile_r", (8, 16, 32), 16, "rows staged in shared memory per step"),
        ScheduleParam("threads", (64, 128, 256), 128, "threads per block"),
    ), (ScheduleConstraint("cuda_resources", weightgrad_resources),)),
], storage=STORAGE_TYPES)  # 16-bit buffers loaded and stored by every template (_expr.LOW_PRECISION_CUDA)
