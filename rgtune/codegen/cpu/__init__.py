"""rgtune.codegen.cpu: kernel IR -> C/OpenMP, compiled by the system C compiler, run through ctypes.

Modules: :mod:`.generate` (the source file), :mod:`.gemm` / :mod:`.edges` (the templates),
:mod:`.rows` (index locals), :mod:`.cwriter` (C text helpers), :mod:`.compiler` (compiler
and on-disk cache), :mod:`.runtime` (graph binding and the run function), :mod:`.backend`
(the registered ``"cpu"`` backend).
"""

from rgtune.codegen.base import register_backend
from rgtune.codegen.cpu.backend import CpuBackend

register_backend("cpu", CpuBackend)

__all__ = ["CpuBackend"]
