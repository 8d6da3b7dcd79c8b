"""rgtune.codegen.cuda: kernel IR -> CUDA C -> NVRTC cubins -> CuPy launches on torch tensors.

* :mod:`.schedule`: the target's schedule knobs and launch limits (checked before compiling).
* :mod:`.generate`: one self-contained CUDA source per IR kernel (templates in ``_gemm``,
  ``_traversal``, ``_map``); schedule constraints checked first, invalid points never compiled.
* :mod:`.nvrtc`: compile through ``cupy.cuda.nvrtc`` (no GPU needed), disk cache, ptxas resources.
* :mod:`.runtime`: tile tables, loading, launching on torch's stream, CUDA-event timing.
* :mod:`.backend`: the ``"cuda"`` :class:`~rgtune.codegen.base.Backend` (registered on import).
* :mod:`.emulate`: the same kernels run on the CPU (C++ with green-thread CUDA built-ins), so
  their results are checked against the reference where no GPU is present.

Precision: sums and products in float32 (``fmaf``, no fast-math); the buffers that ``precision.*``
stores in bfloat16 or float16 are loaded (widened) and stored (rounded once) in that type by every
template (:data:`._expr.LOW_PRECISION_CUDA`); a GEMM that touches one multiplies on the tensor cores
(``mma.m16n8k16`` in that type, float32 sums) where its tile allows (:func:`._gemm.mma_type`).

Example:
    >>> from rgtune.codegen.base import create
    >>> create("cuda").target
    'cuda'
"""

from __future__ import annotations

from rgtune.codegen.base import register_backend
from rgtune.codegen.cuda.backend import CudaBackend
from rgtune.codegen.cuda.generate import GeneratedProgram, InvalidSchedule, generate
from rgtune.codegen.cuda.schedule import CUDA_SCHEDULE

register_backend("cuda", CudaBackend, CUDA_SCHEDULE)

__all__ = ["CudaBackend", "GeneratedProgram", "InvalidSchedule", "generate"]
