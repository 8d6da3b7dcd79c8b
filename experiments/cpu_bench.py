"""The CPU-backend benchmark: tune each layer (>= 100 measured points per mode), then time it side by side.

For every model and dataset and each mode (``inference``: the forward; ``training``: one training
step, forward then backward to the input and every parameter): ``tune --mode M --trials N
--backend cpu --cost-model off`` (TPE alone, every point verified against the float64 reference:
the output, and in training mode every gradient), then ``rgtune bench --memory`` in a fresh process
(rgtune's best inference schedule for the forward and best training schedule for the training
step, its torch lowering, the reference layer, PyG and DGL on the same graph, sizes, weights, input
and threads, and each one's peak memory in its own process; the row goes to BENCHMARKS.md, every
repeat's time to ``--json``). Then per row rgtune's speedup over the faster of PyG and DGL, forward
and training step, and their geometric means (``--summary-only``: from the JSON lines of earlier
runs).

A model with options is written as ``rgtune bench`` names its row: ``rgcn(num_bases=30)``
(each option becomes a ``--model-opt``).

Examples::

    python experiments/cpu_bench.py --db sqlite:///bench.db --trials 100 --threads 2 --repeats 7 --warmup 2
    python experiments/cpu_bench.py --models "rgcn(num_bases=30),rgat(softmax=relation),film" --trials 20
    python experiments/cpu_bench.py --summary-only
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

RESULTS = Path(__file__).resolve().parent / "results"
BASELINES = ("pyg", "dgl")
#: bench's mode -> its column in the JSON lines
COLUMNS = {"inference": "fwd", "training": "fwd+bwd"}


def _model_args(named: str) -> list[str]:
    """``rgcn(num_bases=30,...)`` -> ``--model rgcn --model-opt num_bases=30 ...``."""
    name, _, rest = named.partition("(")
    opts = [o.strip() for o in rest.rstrip(")").split(",") if o.strip()]
    return ["--model", name.strip(), *(a for o in opts for a in ("--model-opt", o))]


def _split_models(text: str) -> list[str]:
    """Comma-separated models, where a model's options (in parentheses) may hold commas too."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [m for m in out + [cur.strip()] if m]


def tune_and_bench(args: argparse.Namespace, model: str, dataset: str) -> None:
    common = [*_model_args(model), "--dataset", dataset, *(["--data-dir", args.data_dir] if args.data_dir else []),
              "--hidden", str(args.hidden)]
    cmds = [["tune", *common, "--mode", mode, "--trials", str(args.trials), "--backend", "cpu", "--db", args.db,
             "--cost-model", "off", "--seed", str(args.seed), "--quiet"] for mode in args.modes.split(",")]
    cmds.append(["bench", *common, "--backend", "cpu", "--db", args.db, "--threads", str(args.threads), "--repeats",
                 str(args.repeats), "--warmup", str(args.warmup), "--json", str(args.json),
                 *([] if args.no_memory else ["--memory"]), *(["--no-write"] if args.no_write else [])])
    for cmd in cmds:
        print("$ " + " ".join(cmd), flush=True)
        subprocess.run([sys.executable, "-m", "rgtune.cli", *cmd], check=True)


def _speedup(ms: dict[str, dict[str, float | None]], column: str) -> tuple[float | None, str | None]:
    ours = ms.get("rgtune", {}).get(column)
    base = {b: ms[b][column] for b in BASELINES if b in ms and ms[b].get(column) is not None}
    faster = min(base, key=base.get) if base else None  # type: ignore[arg-type]
    return ((base[faster] / ours) if faster and ours else None), faster


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The latest run per (model, dataset, sizes, threads): rgtune vs the faster baseline, per column."""
    latest = {(r["model"], r.get("options", ""), r["dataset"], r["in_dim"], r["out_dim"], r["heads"], r["threads"]): r
              for r in rows}
    out = []
    for r in (latest[key] for key in sorted(latest)):
        ms = {k: v["median_ms"] for k, v in r["impls"].items()}
        named = f"{r['model']}({r['options']})" if r.get("options") else r["model"]
        row: dict[str, Any] = {"model": named, "dataset": r["dataset"], "threads": r["threads"],
                               "schedule": r["schedule"]}
        for column in COLUMNS.values():
            speedup, faster = _speedup(ms, column)
            row[column] = {"rgtune_ms": ms.get("rgtune", {}).get(column),
                           **{f"{b}_ms": ms.get(b, {}).get(column) for b in BASELINES},
                           "faster_baseline": faster, "speedup": speedup}
        row["peak_mb"] = {k: v.get("peak_mb", {}).get("fwd+bwd") for k, v in r["impls"].items()}
        out.append(row)
    return out


def print_summary(summary: list[dict[str, Any]]) -> None:
    f = lambda v: "-" if v is None else f"{v:.3g}"  # noqa: E731
    for column in COLUMNS.values():
        print(f"\n{column}:\n| model | dataset | threads | rgtune ms | PyG ms | DGL ms | speedup vs faster | "
              "training-step peak MB: rgtune / PyG / DGL |\n|---|---|---|---|---|---|---|---|")
        for s in summary:
            c, peak = s[column], s["peak_mb"]
            print(f"| {s['model']} | {s['dataset']} | {s['threads']} | {f(c['rgtune_ms'])} | {f(c['pyg_ms'])} | "
                  f"{f(c['dgl_ms'])} | {f(c['speedup'])}x ({c['faster_baseline']}) | "
                  f"{' / '.join(f(peak.get(k)) for k in ('rgtune', 'pyg', 'dgl'))} |")
        speedups = [s[column]["speedup"] for s in summary if s[column]["speedup"]]
        geomean = math.exp(sum(map(math.log, speedups)) / len(speedups)) if speedups else math.nan
        print(f"\ngeomean {column} speedup over the faster of PyG and DGL: {geomean:.2f}x over {len(speedups)} rows; "
              f"lowest {min(speedups, default=math.nan):.2f}x")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("Examples::")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="rgcn,rgat,hgt", help="comma-separated (default rgcn,rgat,hgt)")
    p.add_argument("--datasets", default="aifb,mutag", help="',' or ';'-separated (default aifb,mutag)")
    p.add_argument("--db", default="sqlite:///bench.db", help="trial database URL (default sqlite:///bench.db)")
    p.add_argument("--data-dir", default=None, help="dataset root (default $RGTUNE_DATA_DIR)")
    p.add_argument("--trials", type=int, default=100, help="measured trials per search (default 100)")
    p.add_argument("--modes", default="inference,training", help="modes tuned (default inference,training)")
    p.add_argument("--no-memory", action="store_true", help="bench without the peak-memory processes")
    p.add_argument("--hidden", type=int, default=64, help="feature size in = out (default 64)")
    p.add_argument("--threads", type=int, default=2, help="threads for every implementation (default 2)")
    p.add_argument("--repeats", type=int, default=7, help="timed rounds (default 7)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs per implementation (default 2)")
    p.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    p.add_argument("--json", type=Path, default=RESULTS / "cpu_bench.jsonl", help="JSON lines (appended)")
    p.add_argument("--no-write", action="store_true", help="do not touch BENCHMARKS.md")
    p.add_argument("--summary-only", action="store_true", help="only summarize the JSON lines already there")
    args = p.parse_args(argv)
    if not args.summary_only:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        sep = ";" if "synthetic:" in args.datasets else ","  # a synthetic spec holds commas
        for dataset in args.datasets.split(sep):
            for model in _split_models(args.models):
                tune_and_bench(args, model.strip(), dataset.strip())
    if not args.json.exists():
        print(f"no results at {args.json}", file=sys.stderr)
        return 1
    summary = summarize([json.loads(line) for line in args.json.read_text().splitlines() if line.strip()])
    print_summary(summary)
    args.json.with_suffix(".summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
