"""rgtune.bench: time one layer side by side against its torch lowering, the reference layer, PyG and DGL.

* :mod:`.layers`: :func:`bench`, the implementations with copied weights, their checks (every row,
  or sampled rows on a big graph) and their timing;
* :mod:`.isolated`: each implementation in a watched process of its own (time and memory limits:
  "OOM" and "> N s" rows), one after another;
* :mod:`.baselines`: PyG's and DGL's layers with rgtune's weights, and where their math differs;
* :mod:`.memory`: measuring a process's peak memory; :func:`~.memory.measure_step`, one step's peak
  and times in a process of its own;
* :mod:`.report`: the console table, the generated BENCHMARKS.md section, one JSON line per run.

``rgtune bench`` (:mod:`rgtune.cli.bench`) is the command line.
"""

from rgtune.bench.layers import IMPLS, MODES, BenchResult, Impl, bench
from rgtune.bench.report import BEGIN, END, format_table, result_json, write_benchmarks

__all__ = ["IMPLS", "MODES", "BEGIN", "END", "BenchResult", "Impl", "bench", "format_table", "result_json",
           "write_benchmarks"]
