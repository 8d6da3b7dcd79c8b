"""The backward's shared reductions three ways: recomputed per kernel, stored once, one merged traversal.

Makes BENCHMARKS.md's table "The attention-score gradient: `autodiff.reuse`". Per model, dataset and
feature size: the default training schedule with ``autodiff.reuse`` = inline | store | fuse, everything else
equal, timed as a user calls the layer (``y = layer(x)``, then the backward of ``sum(y * g)``: the trial's
``call`` objective) in --rounds interleaved rounds in one measurement process (each round in a new order),
the median of each. Prints and appends to --json one row per (model, dataset, hidden): the three medians,
their kernel counts, and fuse's and store's ratios to inline. On a GPU pass ``--backend cuda``.

On the CPU the step's time hides the edge kernels' share (the GEMMs, the call's host path and the noise of
a 2-core machine are larger than what merging saves): ``--edge-kernels`` also times the backward's per-edge
stores alone (the traversals that write per-edge values, store's kernels of the shared sums, and the
destination sums the stores read: the softmax backward, which fuse walks in the same traversal), each
wrapped in a timer inside the CPU runtime's step list, the three programs' steps run in turn, --rounds x 5
steps each; the row gets ``{choice}_edge_ms`` (the median of their summed time per step).

    python experiments/edge_stores.py --models rgat,hgt --datasets aifb,mutag --hidden 16,64 --threads 2 \\
        --json experiments/results/edge_stores/cpu.jsonl
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import append_jsonl, canonical_dataset, parser, rounds_ms, setup, split_names  # noqa: E402

CHOICES = ("inline", "store", "fuse")


def one(model: str, dataset: str, hidden: int, args: Any, backend: str) -> dict[str, Any]:
    from rgtune.data import load_dataset
    from rgtune.search_spaces import SearchSpace
    from rgtune.tuner.measure import MeasureOptions
    from rgtune.tuner.workload import Workload

    workload = Workload(model, dataset, hidden, hidden, 1 if model == "rgcn" else args.heads, backend,
                        args.data_dir, mode="training")
    space = SearchSpace(workload.program(), load_dataset(dataset, root=args.data_dir),
                        "cuda" if backend == "cuda" else "cpu", mode="training")
    if "autodiff.reuse" not in {k.name for k in space.ir_knobs}:
        raise SystemExit(f"{model}: its backward has no shared reduction (no autodiff.reuse knob)")
    configs = {c: {**space.default(), "autodiff.reuse": c} for c in CHOICES}
    kernels = {c: len(space.compile(cfg).kernels.kernels) for c, cfg in configs.items()}
    times = rounds_ms(workload, configs, args.rounds, MeasureOptions(objective="call"))
    med = {c: statistics.median(t for t in v if t is not None) if any(t is not None for t in v) else None
           for c, v in times.items()}
    row: dict[str, Any] = {"model": model, "dataset": dataset, "hidden": hidden, "backend": backend,
                           "rounds": args.rounds, "threads": args.threads,
                           **{f"{c}_ms": med[c] for c in CHOICES}, **{f"{c}_kernels": kernels[c] for c in CHOICES}}
    for c in ("store", "fuse"):
        row[f"inline_over_{c}"] = None if not med[c] or med["inline"] is None else med["inline"] / med[c]
    if args.edge_kernels:
        row.update({f"{c}_edge_ms": ms for c, ms in edge_kernels_ms(space, configs, hidden, args.rounds * 5).items()})
    return row


def edge_kernels_ms(space: Any, configs: dict[str, dict[str, Any]], hidden: int, steps: int) -> dict[str, float]:
    """The backward's per-edge stores' (and the destination sums they read) summed time per training step,
    median over ``steps`` (CPU backend)."""
    import time

    import torch

    from rgtune.codegen.base import create
    from rgtune.codegen.reference import init_params
    from rgtune.ir.kernels import AggregateStage, AggregateStores, EdgeStore, EdgeStores, TraversalKernel

    g = space.graph
    n = g.num_nodes()
    x, dout = torch.randn(n, hidden), torch.randn(n, hidden)
    runs, spent = {}, {c: [] for c in configs}
    for c, cfg in configs.items():
        point = space.compile(cfg)
        kp = point.kernels
        built = create("cpu").build(kp, g, point.config)
        runtime = built.run_fn.__self__  # the CpuRuntime: its steps are the kernels in program order
        params = init_params(kp, g)
        backward = [(i, k) for i, k in enumerate(kp.kernels) if i >= (kp.forward_kernels or 0)
                    and isinstance(k, TraversalKernel)]
        stores = {i for i, k in backward if isinstance(k.stage, (EdgeStore, EdgeStores, AggregateStores))}
        read = set().union(*(kp.kernels[i].reads() for i in stores))
        # and the destination sums the stores read (the softmax backward's): fuse walks them with the stores
        edge = stores | {i for i, k in backward if isinstance(k.stage, AggregateStage) and k.stage.out in read}
        total = [0.0]

        def timed(step: Any) -> Any:
            def run(*a: Any) -> None:
                t = time.perf_counter()
                step(*a)
                total[0] += time.perf_counter() - t
            return run

        runtime.steps = [timed(s) if i in edge else s for i, s in enumerate(runtime.steps)]
        runs[c] = (built, params, total)
    for _ in range(3):  # warm-up
        for built, params, _total in runs.values():
            built.run_training(x, params, dout)
    for _ in range(steps):
        for c, (built, params, total) in runs.items():
            total[0] = 0.0
            built.run_training(x, params, dout)
            spent[c].append(total[0] * 1e3)
    return {c: statistics.median(v) for c, v in spent.items()}


def main() -> None:
    p = parser(__doc__, "models", "datasets", "backend", "data-dir", "threads", models="rgat,hgt")
    p.add_argument("--hidden", default="16,64", help="feature sizes, comma-separated (default 16,64)")
    p.add_argument("--heads", type=int, default=1, help="attention heads (default 1)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds per schedule (default 7)")
    p.add_argument("--json", type=Path, default=None, help="append one JSON line per row here")
    p.add_argument("--edge-kernels", action="store_true",
                   help="also time the backward's per-edge stores alone (CPU backend; see above)")
    args = p.parse_args()
    backend = setup(p, args)
    if args.edge_kernels and backend != "cpu":
        p.error(f"--edge-kernels times the CPU runtime's kernels; the backend is {backend!r}")
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)  # the in-process edge-kernel timing's (the workers read the environment)
    for model in split_names(args.models):
        for dataset in split_names(args.datasets):
            for hidden in (int(h) for h in split_names(args.hidden)):
                row = one(model, canonical_dataset(dataset, args.data_dir), hidden, args, backend)
                print(f"{model} {dataset} hidden {hidden}: " + ", ".join(
                    f"{c} {row[f'{c}_ms']:.3f} ms ({row[f'{c}_kernels']} kernels)" if row[f"{c}_ms"] else f"{c} failed"
                    for c in CHOICES) + "; inline/fuse " + (f"{row['inline_over_fuse']:.2f}x"
                                                           if row["inline_over_fuse"] else "-"), flush=True)
                if args.edge_kernels:
                    print("  the backward's edge stores alone: " + ", ".join(
                        f"{c} {row[f'{c}_edge_ms']:.3f} ms" for c in CHOICES), flush=True)
                if args.json is not None:
                    append_jsonl(args.json, row)


if __name__ == "__main__":
    main()
