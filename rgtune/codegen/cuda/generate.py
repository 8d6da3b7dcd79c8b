"""Kernel IR + schedule -> CUDA C: one self-contained source per IR kernel.

:func:`generate` checks the schedule against the templates' declared constraints
(:data:`.schedule.CUDA_SCHEDULE`; an invalid point raises :class:`InvalidSchedule` and is
never compiled), then turns each kernel into a :class:`~rgtune.codegen.cuda._unit.KernelUnit`:

* :class:`~rgtune.ir.kernels.GemmKernel` -> ``gemm`` (see :mod:`._gemm`): shared-memory tiled
  segment GEMM, rows grouped by type, static or balanced block partition, fused epilogue;
* :class:`~rgtune.ir.kernels.TraversalKernel` -> ``traverse`` (or the three edge-softmax
  passes, see :mod:`._traversal`): destination-parallel warps or edge-parallel threads;
* :class:`~rgtune.ir.kernels.MapKernel` -> ``map`` (see :mod:`._map`);
* :class:`~rgtune.ir.kernels.WeightKernel` -> nothing: derived weights are folded with torch
  on the device (:mod:`rgtune.codegen.weights`), once per call;
* a training program's :class:`~rgtune.ir.kernels.ScatterKernel` -> ``scatter`` (see
  :mod:`._scatter`): a warp per source over host-grouped rows, or edge-parallel atomics;
* and its :class:`~rgtune.ir.kernels.WeightGradKernel` -> ``weightgrad`` (see
  :mod:`._weightgrad`): row chunks reduced per block, combined by atomics or a second pass.

Sizes that define the program (heads, feature sizes, tiles) are compile-time constants; graph
sizes (rows, edges) and the graph's index arrays are kernel arguments, so one compiled
kernel serves every graph. Indices are ``idx_t`` (``int`` or ``long long`` per
``layout.index_bits``); flat offsets are computed in 64 bits. Arithmetic is float32 with
``fmaf``; a buffer that ``precision.*`` stores in 16 bits is widened as it is loaded and rounded
once as it is stored (vector loads and stores of 2 or 4 elements where the schedule's vector width
says so). BF16/FP16 tensor-core GEMMs would be a further schedule knob (not implemented).

Example:
    >>> from rgtune.ir.models import build_model
    >>> from rgtune.ir.pipeline import compile_program
    >>> kp = compile_program(build_model("rgcn", 8, 8)).kernels
    >>> prog = generate(kp, {})
    >>> [u.name for u in prog.units]  # the aggregation adds into the root GEMM's rows (rgtune.ir.addend)
    ['gemm1', 'gemm2', 'aggregate1']
    >>> print(prog.units[2].code.splitlines()[0])
    // template traversal: out[dst] += (in0@row * inv_dst_rel_degree); warp per destination, no atomics
    >>> "atomicAdd" in prog.units[2].code
    False
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from rgtune.codegen.base import BackendError
from rgtune.codegen.cuda._expr import UnsupportedKernel
from rgtune.codegen.cuda._gemm import gemm_unit, micro_tile, segments_of
from rgtune.codegen.cuda._map import map_unit
from rgtune.codegen.cuda._scatter import scatter_unit
from rgtune.codegen.cuda._traversal import traversal_unit
from rgtune.codegen.cuda._unit import Arg, Grid, KernelUnit, Launch, Temp
from rgtune.codegen.cuda._weightgrad import weightgrad_unit
from rgtune.codegen.cuda.schedule import CUDA_SCHEDULE
from rgtune.ir.kernels import (GemmKernel, KernelProgram, MapKernel, ScatterKernel, TraversalKernel, WeightGradKernel,
                               WeightKernel)

__all__ = ["Arg", "GeneratedProgram", "Grid", "InvalidSchedule", "KernelUnit", "Launch", "Temp",
           "UnsupportedKernel", "generate", "micro_tile", "segments_of"]


class InvalidSchedule(BackendError):
    """The schedule violates a template constraint; the point must be recorded as invalid, not compiled."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid CUDA schedule: " + "; ".join(problems))
        self.problems = problems


@dataclass
class GeneratedProgram:
    """The CUDA sources of one kernel program under one schedule."""

    kp: KernelProgram
    schedule: dict[str, Any]
    units: list[KernelUnit] = field(default_factory=list)

    @property
    def sources(self) -> dict[str, str]:
        """File name -> source text (``gemm1.cu``, ...), as :class:`BuiltProgram.sources` keeps them."""
        return {f"{u.name}.cu": u.source for u in self.units}

    def unit(self, name: str) -> KernelUnit:
        for u in self.units:
            if u.name == name:
                return u
        raise KeyError(f"no kernel {name!r}; kernels: {[u.name for u in self.units]}")


def generate(kp: KernelProgram, schedule: Mapping[str, Any], epilogue: str = "auto") -> GeneratedProgram:
    """CUDA C for every kernel of ``kp`` (template parameters from ``schedule``, defaults elsewhere).

    ``epilogue="row"`` forces the general GEMM-epilogue path (finished rows read back from
    global memory) instead of the shared-memory inner-product reduction; for tests.
    """
    problems = CUDA_SCHEDULE.check(kp, schedule)
    if problems:
        raise InvalidSchedule(problems)
    out = GeneratedProgram(kp, dict(schedule))
    for k in kp.kernels:
        s = CUDA_SCHEDULE.kernel_schedule(k, schedule)
        if isinstance(k, WeightKernel):
            continue
        if isinstance(k, GemmKernel):
            out.units.append(gemm_unit(k, s, kp, epilogue))
        elif isinstance(k, TraversalKernel):
            out.units.append(traversal_unit(k, s, kp))
        elif isinstance(k, MapKernel):
            out.units.append(map_unit(k, s, kp))
        elif isinstance(k, ScatterKernel):
            out.units.append(scatter_unit(k, s, kp))
        elif isinstance(k, WeightGradKernel):
            out.units.append(weightgrad_unit(k, s, kp))
        else:  # pragma: no cover - a new template needs a generator here
            raise UnsupportedKernel(f"{k.name}: no CUDA template for {type(k).__name__}")
    return out
