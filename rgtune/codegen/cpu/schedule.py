"""The ``cpu`` target's schedule knobs: what the C/OpenMP generator lets each kernel template choose.

Read by :mod:`.gemm` (``impl``, the tile), :mod:`.edges` (``mapping``, ``chunk``) and
:mod:`.generate` (the map's ``chunk``); :mod:`.runtime` builds the tile tables of the chosen tile.

Example:
    >>> list(CPU_SCHEDULE.knobs())
    ['gemm.impl', 'gemm.tile_rows', 'gemm.tile_cols', 'traversal.mapping', 'traversal.chunk', 'map.chunk']
"""

from __future__ import annotations

from rgtune.codegen.schedule import (MAPPING_CONSTRAINT, TRAVERSAL_MAPPING, ScheduleParam, TargetSchedule,
                                     TemplateSchedule)
from rgtune.ir.kernels import GemmKernel, MapKernel, TraversalKernel

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
])
