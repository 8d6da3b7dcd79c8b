"""Where the time of one tuned-layer forward goes on a GPU: kernels, the program's host path, the layer's host path.

Makes BENCHMARKS.md's table "The host path" (GPU backend: H100). For each model (default schedule, or --db's
tuned one) the layer is built twice, replaying a recorded CUDA graph and launching kernel by kernel, and
timed in one process: program events (`BuiltProgram.run` back to back, CUDA events around the loop),
program + sync (one run, then `torch.cuda.synchronize()`, wall clock), layer + sync (the same through
`layer(x)`), and the synchronization alone. Medians of --repeats after 10 warm-up calls. Needs a CUDA GPU.

Examples::

    python experiments/gpu_overhead.py --dataset aifb --models rgcn,hgt
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parser  # noqa: E402 - experiments/ is not a package


def wall_ms(fn: Callable[[], object], repeats: int, events: bool = False) -> float:
    """Median wall-clock ms of ``fn()`` and a device synchronization, after 10 warm-up calls; ``events``:
    the mean ms per call of ``repeats`` back-to-back calls, by CUDA events around the loop."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    if events:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / repeats
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv: Sequence[str] | None = None) -> int:
    p = parser(__doc__, "models", "hidden", "data-dir", models="rgcn,hgt")
    p.add_argument("--dataset", default="aifb", help="dataset (default aifb)")
    p.add_argument("--db", default=None, help="trial database: the tuned schedule (default: the default schedule)")
    p.add_argument("--repeats", type=int, default=200, help="timed calls (default 200)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.exit(1, "gpu_overhead: error: needs a CUDA GPU (torch.cuda.is_available() is False)\n")
    from rgtune.codegen.cuda.backend import CudaBackend
    from rgtune.data import load_dataset
    from rgtune.runtime import load_tuned
    from rgtune.runtime.module import tuned_layer

    graph = load_dataset(args.dataset, root=args.data_dir)
    x = torch.randn(graph.num_nodes(), args.hidden, device="cuda")
    print(f"sync alone: {wall_ms(lambda: None, args.repeats):.4f} ms")
    print(f"{'model':6} {'launch':17} {'program events':>15} {'program + sync':>15} {'layer + sync':>13}")
    for model in args.models.split(","):
        for graphs in (True, False):
            backend = CudaBackend(graphs=graphs)
            layer = (load_tuned(model, graph, args.hidden, args.hidden, db=args.db, backend=backend).to("cuda")
                     if args.db else tuned_layer(model, graph, args.hidden, args.hidden, backend=backend, device="cuda"))
            runner = layer._runner
            built = runner.program("inference")[1]  # the BuiltProgram that layer(x) runs
            params = dict(zip(runner.names, [layer._parameters[n] for n in runner.names]))
            with torch.no_grad():
                row = (wall_ms(lambda: built.run(x, params), args.repeats, events=True),
                       wall_ms(lambda: built.run(x, params), args.repeats), wall_ms(lambda: layer(x), args.repeats))
            print(f"{model:6} {'cuda graph' if graphs else 'kernel by kernel':17} {row[0]:15.4f} {row[1]:15.4f} "
                  f"{row[2]:13.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
