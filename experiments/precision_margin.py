"""How far a 16-bit program's error is from the rounded reference's: the measurement behind LOW_PRECISION_MARGIN.

A program storing intermediates in bfloat16 or float16 is checked against ``LOW_PRECISION_MARGIN`` x the error
of the float64 reference rounded to that type at every op, on the same inputs
(:mod:`rgtune.tuner.verification`). Both errors are maxima over a result's elements of rounding noise: for a
result of few elements (an attention vector's gradient: heads x features) each is one noisy draw, so their
ratio varies from case to case even where the program rounds less than the reference. Per model, dataset and
type, this script checks training programs (the default schedule and --random sampled ones, each on --seeds
cases, the verifier's cases) at 13 -> 10 features (the precision tests' sizes) and prints, per result, the
ratio program error / rounded reference's error; it appends one row per (model, dataset, type, schedule,
seed, result) to --json, and prints each result's largest ratio and the ratio's quantiles over all rows.

    python experiments/precision_margin.py --models rgcn,rgat,hgt --seeds 8 --random 2 \\
        --json experiments/results/precision/margin.jsonl
"""

from __future__ import annotations

import random
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import append_jsonl, parser, setup, split_names  # noqa: E402

DIMS = (13, 10)
HEADS = {"rgcn": 1, "rgat": 2, "hgt": 2}
TYPES = {"bf16": "bfloat16", "fp16": "float16"}


def ratios(model: str, dataset: str, precision: str, args: Any) -> list[dict[str, Any]]:
    """The rows of one (model, dataset, type): every schedule on every seed."""
    from rgtune.codegen.cpu import CpuBackend
    from rgtune.codegen.training import train_step
    from rgtune.data import load_dataset
    from rgtune.ir.models import build_model
    from rgtune.ir.passes.precision import lowest_storage
    from rgtune.search_spaces.space import SearchSpace
    from rgtune.tuner.verification import LOW_PRECISION_MARGIN, Verifier

    graph = load_dataset(dataset, args.data_dir)
    program = build_model(model, *DIMS, HEADS[model])
    space = SearchSpace(program, graph, "cpu", mode="training", precision=precision)
    rng = random.Random(42)
    schedules = [("default", space.default())] + [(f"random{i}", space.sample(rng)) for i in range(args.random)]
    verifier, backend = Verifier(program, graph, training=True), CpuBackend()
    cases = [verifier.case(seed=s) for s in range(args.seeds)]
    rows = []
    for label, cfg in schedules:
        point = space.compile(cfg)
        storage = lowest_storage(point.kernels)
        built = backend.build(point.kernels, graph, cfg)
        for seed, case in enumerate(cases):
            c = case.on("cpu")
            out, dx, grads = train_step(built, point.kernels, graph, c.x, c.params, c.dout)
            got = {"output": out, "input gradient": dx, **{f"gradient of {n}": g for n, g in grads.items()}}
            reference = {k: v / LOW_PRECISION_MARGIN[storage] for k, v in case.low_precision_tolerances(storage).items()}
            for name, expected in case.expected.items():
                if name not in got and not bool(expected.value.any()):
                    continue  # a parameter the program does not read (the verifier skips it too)
                err = expected.error(got[name])
                rows.append({"model": model, "dataset": graph.name, "precision": precision, "schedule": label,
                             "seed": seed, "result": name, "error": err, "reference_error": reference[name],
                             "ratio": err / reference[name] if reference[name] else float("inf")})
    return rows


def main() -> None:
    p = parser(__doc__, "models", "datasets", "backend", "data-dir", "threads", models="rgcn,rgat,hgt")
    p.add_argument("--precisions", default="bf16,fp16", help="16-bit types, comma-separated (default bf16,fp16)")
    p.add_argument("--seeds", type=int, default=8, help="verifier cases per schedule (default 8)")
    p.add_argument("--random", type=int, default=2, help="random schedules besides the default (default 2)")
    p.add_argument("--json", type=Path, default=None, help="append the rows to this JSON-lines file")
    args = p.parse_args()
    if setup(p, args) != "cpu":
        p.error("the 16-bit programs are checked on the cpu backend (its C compiler is needed)")
    every = []
    for model in split_names(args.models):
        for dataset in split_names(args.datasets):
            for precision in split_names(args.precisions):
                if precision not in TYPES:
                    p.error(f"unknown precision {precision!r}; choose from {sorted(TYPES)}")
                rows = ratios(model, dataset, precision, args)
                every += rows
                for r in rows if args.json else ():
                    append_jsonl(args.json, r)
                worst: dict[str, float] = {}
                for r in rows:
                    worst[r["result"]] = max(worst.get(r["result"], 0.0), r["ratio"])
                print(f"{model} {dataset} {precision}: largest ratio per result "
                      + ", ".join(f"{k} {v:.2f}" for k, v in worst.items()), flush=True)
    values = sorted(r["ratio"] for r in every)
    q = statistics.quantiles(values, n=100)
    print(f"{len(values)} results: ratio median {q[49]:.2f}, 99th percentile {q[98]:.2f}, largest {values[-1]:.2f}")
    for r in sorted(every, key=lambda r: -r["ratio"])[:5]:
        print(f"  {r['ratio']:.2f}  {r['model']} {r['dataset']} {r['precision']} {r['schedule']} seed {r['seed']} "
              f"{r['result']}: {r['error']:.3g} vs {r['reference_error']:.3g}")


if __name__ == "__main__":
    main()
