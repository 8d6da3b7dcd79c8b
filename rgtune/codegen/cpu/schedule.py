"""The ``cpu`` target's schedule knobs: what the C/OpenMP generator lets each kernel template choose.

Read by :mod:`.gemm` (``impl``, the tile), :mod:`.edges` (``mapping``, ``chunk``; the scatter's
``mapping`` and ``chunk``), :mod:`.generate` (the map's ``chunk``) and :mod:`.weightgrad` (``impl``,
``reduce``, ``chunk_rows``); :mod:`.runtime` builds the tile tables of the chosen tile, the scatter's
grouping by target and the weight gradient's row chunks.

The backward's templates (a training program's: ``scatter``, ``weightgrad``) come after the forward's,
so the forward's knobs keep their order (and an inference search space leaves the backward's out).
Every value of their knobs works for every kernel of their template (both scatter mappings take any
layout and target; both weight-gradient implementations any rows, types and heads), so they declare
no constraint.

Example:
    >>> list(CPU_SCHEDULE.knobs())  # doctest: +NORMALIZE_WHITESPACE
    ['gemm.impl', 'gemm.tile_rows', 'gemm.tile_cols', 'traversal.mapping', 'traversal.chunk', 'map.chunk',
     'scatter.mapping', 'scatter.chunk', 'weightgrad.impl', 'weightgrad.reduce', 'weightgrad.chunk_rows']
"""

from __future__ import annotations

from rgtune.codegen.schedule import (MAPPING_CONSTRAINT, TRAVERSAL_MAPPING, ScheduleParam, TargetSchedule,
                                     TemplateSchedule)
from rgtune.ir.passes.precision import STORAGE_TYPES
from rgtune.ir.kernels import GemmKernel, MapKernel, ScatterKernel, TraversalKernel, WeightGradKernel

CPU_SCHEDULE = TargetSchedule("cpu", [
    TemplateSchedule(GemmKernel, (
        ScheduleParam("impl", ("generated", "blas"), "generated",
                      "generated tiled C, or per-segment BLAS calls through torch"),
        ScheduleParam("tile_rows", (8, 16, 32, 64), 16, "rows per tile: rows that share a pass over the weight"),
        ScheduleParam("tile_cols", (16, 32, 64), 64, "output columns per tile"),
    )),
    TemplateSchedule(TraversalKernel, (
        TRAVERSAL_MAPPING,
        ScheduleParam("chunk", (16, 64, 256, 1024), 64, "OpenMP dynamic chunk (rows per grab)"),
    ), (MAPPING_CONSTRAINT,)),
    TemplateSchedule(MapKernel, (
        ScheduleParam("chunk", (64, 256, 1024), 256, "OpenMP static chunk (rows)"),
    )),
    TemplateSchedule(ScatterKernel, (
        ScheduleParam("mapping", ("owner", "atomic"), "owner",
                      "owner: target-parallel, rows grouped by target through a per-graph permutation, each "
                      "target's sum is one thread's (no atomics); atomic: row-parallel in the layout's order, "
                      "atomic adds"),
        ScheduleParam("chunk", (16, 64, 256, 1024), 64, "OpenMP dynamic chunk (targets or rows per grab)"),
    )),
    TemplateSchedule(WeightGradKernel, (
        ScheduleParam("impl", ("generated", "blas"), "generated",
                      "generated C (row chunks of one type, register-blocked outer products), or per-type "
                      "matmuls X_t^T @ DY_t through torch"),
        ScheduleParam("reduce", ("split", "atomic"), "split",
                      "how the partial sums of a type's row groups meet (generated): split: each group writes its "
                      "own, a second pass sums them per type (deterministic); atomic: each group adds its sum "
                      "with atomic adds"),
        ScheduleParam("chunk_rows", (64, 256, 1024), 256,
                      "rows packed per pass of the register-blocked outer products (generated): one type's rows"),
    )),
], storage=STORAGE_TYPES)  # the C kernels load and store bfloat16 and float16 buffers (sums in float32)
