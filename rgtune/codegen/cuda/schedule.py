"""The ``cuda`` target's schedule knobs and the launch limits they must respect.

Read by :mod:`._gemm` (block tile, K slice, threads, block partition), :mod:`._traversal`
(mapping, threads, vector width, coarsening) and :mod:`._map` (threads). The limits are
checked before anything is compiled, so an impossible point is recorded as invalid, not built:
a GEMM block's two shared-memory tiles must fit the static shared memory a block may use
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
from rgtune.ir.kernels import GemmKernel, Kernel, MapKernel, TraversalKernel

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


def _vector_width(s: Mapping[str, Any], k: Kernel) -> str | None:
    assert isinstance(k, TraversalKernel)
    v = s.get("vector_width", 1)
    if v > 1 and k.stage.feature_dim() % v:
        return f"vector width {v} does not divide the feature size {k.stage.feature_dim()}"
    return None


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
        ScheduleParam("vector_width", (1, 2, 4), 1, "features per thread (float, float2, float4)"),
        ScheduleParam("coarsening", (1, 2, 4), 1, "destinations (or edges) per warp"),
    ), (MAPPING_CONSTRAINT, ScheduleConstraint("vector_width", _vector_width))),
    TemplateSchedule(MapKernel, (
        ScheduleParam("threads", (64, 128, 256), 256, "threads per block"),
    )),
])
