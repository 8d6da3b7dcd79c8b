"""rgtune.codegen.cpu: kernel IR -> C/OpenMP, compiled by the system C compiler, run through ctypes.

Modules: :mod:`.generate` (the source file), :mod:`.gemm` / :mod:`.edges` (the templates),
:mod:`.rows` (index locals), :mod:`.schedule` (the target's schedule knobs), :mod:`.cwriter` (C text helpers), :mod:`.compiler` (compiler
and on-disk cache), :mod:`.runtime` (graph binding and the run function), :mod:`.backend`
(the registered ``"cpu"`` backend).
"""

import os

# The generated libraries load the system's OpenMP runtime, torch carries its own. With the
# default (active) wait policy the idle threads of one runtime spin while the other works, and
# a tuned kernel called between torch ops ran several times slower (measured: 22 -> 6.7 ms
# alone, 104 -> 9.3 ms right after a torch matmul, RGCN on AIFB). libgomp reads this when the
# first generated library loads it; a value the user set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from rgtune.codegen.base import register_backend  # noqa: E402
from rgtune.codegen.cpu.backend import CpuBackend  # noqa: E402
from rgtune.codegen.cpu.schedule import CPU_SCHEDULE  # noqa: E402

register_backend("cpu", CpuBackend, CPU_SCHEDULE)

__all__ = ["CpuBackend"]
