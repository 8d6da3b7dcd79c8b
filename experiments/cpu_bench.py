"""The CPU-backend benchmark: tune each layer (>= 100 measured points), then time it side by side.

For every model (RGCN, RGAT, HGT) and dataset (AIFB, MUTAG):

1. ``tune --model M --dataset D --trials N --backend cpu --cost-model off`` (TPE alone: N measured
   points, each verified against the float64 reference) into one trial database;
2. ``rgtune bench --model M --dataset D --backend cpu`` in a fresh process: rgtune's best
   schedule, its torch lowering, the reference layer, PyG and DGL on the same graph, sizes,
   weights, input and threads, median of interleaved repeats after warm-up; its row goes to
   BENCHMARKS.md and every repeat's time to ``--json``.

Then a summary: per row, the forward speedup of rgtune over the faster of PyG and DGL, and the
geometric mean over rows. ``--summary-only`` re-prints it from the JSON lines of earlier runs.

Examples::

    python experiments/cpu_bench.py --help
    python experiments/cpu_bench.py --db sqlite:///bench.db --trials 100 --threads 2
    python experiments/cpu_bench.py --summary-only
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

RESULTS = Path(__file__).resolve().parent / "results"
BASELINES = ("pyg", "dgl")


def _run(cmd: list[str]) -> None:
    print("$ " + " ".join(cmd[2:] if cmd[:2] == [sys.executable, "-m"] else cmd), flush=True)
    t0 = time.time()
    subprocess.run(cmd, check=True)
    print(f"  ({time.time() - t0:.0f} s)", flush=True)


def tune_and_bench(args: argparse.Namespace, model: str, dataset: str) -> None:
    common = ["--model", model, "--dataset", dataset]
    if args.data_dir:
        common += ["--data-dir", args.data_dir]
    _run([sys.executable, "-m", "rgtune.cli", "tune", *common, "--trials", str(args.trials), "--backend", "cpu",
          "--db", args.db, "--cost-model", "off", "--seed", str(args.seed), "--hidden", str(args.hidden), "--quiet"])
    _run([sys.executable, "-m", "rgtune.cli", "bench", *common, "--backend", "cpu", "--db", args.db,
          "--threads", str(args.threads), "--repeats", str(args.repeats), "--warmup", str(args.warmup),
          "--hidden", str(args.hidden), "--json", str(args.json), *(["--no-write"] if args.no_write else [])])


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The latest run per (model, dataset, sizes, threads): rgtune's forward vs the faster baseline."""
    latest: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        latest[(r["model"], r["dataset"], r["in_dim"], r["out_dim"], r["heads"], r["threads"])] = r
    out = []
    for key in sorted(latest):
        r = latest[key]
        ms = {k: v["median_ms"] for k, v in r["impls"].items()}
        ours = ms.get("rgtune", {}).get("fwd")
        base = {b: ms[b]["fwd"] for b in BASELINES if b in ms and ms[b]["fwd"] is not None}
        faster = min(base, key=base.get) if base else None
        out.append({"model": r["model"], "dataset": r["dataset"], "threads": r["threads"], "schedule": r["schedule"],
                    "rgtune_fwd_ms": ours, **{f"{b}_fwd_ms": base.get(b) for b in BASELINES},
                    "faster_baseline": faster,
                    "speedup_fwd": (base[faster] / ours) if faster and ours else None,
                    "rgtune_fwdbwd_ms": ms.get("rgtune", {}).get("fwd+bwd"),
                    "best_baseline_fwdbwd_ms": min((ms[b]["fwd+bwd"] for b in BASELINES
                                                    if b in ms and ms[b]["fwd+bwd"] is not None), default=None)})
    return out


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def print_summary(summary: list[dict[str, Any]]) -> None:
    print("\n| model | dataset | threads | rgtune fwd ms | PyG fwd ms | DGL fwd ms | speedup vs faster |")
    print("|---|---|---|---|---|---|---|")
    for s in summary:
        f = lambda v: "-" if v is None else f"{v:.3g}"  # noqa: E731
        print(f"| {s['model']} | {s['dataset']} | {s['threads']} | {f(s['rgtune_fwd_ms'])} | {f(s['pyg_fwd_ms'])} | "
              f"{f(s['dgl_fwd_ms'])} | {f(s['speedup_fwd'])}x ({s['faster_baseline']}) |")
    speedups = [s["speedup_fwd"] for s in summary if s["speedup_fwd"]]
    print(f"\ngeomean forward speedup over the faster of PyG and DGL: {geomean(speedups):.2f}x over {len(speedups)} rows")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Writes rows to BENCHMARKS.md and JSON lines to --json.")
    p.add_argument("--models", default="rgcn,rgat,hgt", help="comma-separated (default rgcn,rgat,hgt)")
    p.add_argument("--datasets", default="aifb,mutag", help="comma-separated (default aifb,mutag)")
    p.add_argument("--db", default="sqlite:///bench.db", help="trial database URL (default sqlite:///bench.db)")
    p.add_argument("--data-dir", default=None, help="dataset root (default $RGTUNE_DATA_DIR)")
    p.add_argument("--trials", type=int, default=100, help="measured trials per search (default 100)")
    p.add_argument("--hidden", type=int, default=64, help="feature size in = out (default 64)")
    p.add_argument("--threads", type=int, default=2, help="threads for every implementation (default 2)")
    p.add_argument("--repeats", type=int, default=7, help="timed rounds (default 7)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs per implementation (default 2)")
    p.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    p.add_argument("--json", type=Path, default=RESULTS / "cpu_bench.jsonl", help="JSON lines (appended)")
    p.add_argument("--no-write", action="store_true", help="do not touch BENCHMARKS.md")
    p.add_argument("--summary-only", action="store_true", help="only summarize the JSON lines already there")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.summary_only:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        for dataset in args.datasets.split(","):
            for model in args.models.split(","):
                tune_and_bench(args, model.strip(), dataset.strip())
    if not args.json.exists():
        print(f"no results at {args.json}", file=sys.stderr)
        return 1
    rows = [json.loads(line) for line in args.json.read_text().splitlines() if line.strip()]
    summary = summarize(rows)
    print_summary(summary)
    (args.json.with_suffix(".summary.json")).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
