"""Real-size graphs: `tune` studies on the BGS-, AM- and ogbn-mag-sized presets, what a trial costs, and the transfer.

Makes BENCHMARKS.md's "Real-size graphs" study table and its "Cost-model transfer" numbers. Each study is
the `tune` a user runs (its own process; the cost model on, trained on the history in --db: BENCHMARKS.md's
random-sampler studies on AIFB and MUTAG). Per study: its wall time, the trials' statuses, the default and
best schedule, and from the database per verified trial the share of its wall time spent compiling and
verifying (the float64 oracle's own time), the sampled verification's coverage and the peak memory of the
measuring process. --transfer: `rgtune costmodel --eval --holdout` on each big graph, trained on the small
graphs alone (the other big graphs' trials left out). JSON lines go to experiments/results/scale/.

Examples::

    python experiments/scale_studies.py --fresh --datasets synthetic:bgs,synthetic:am,synthetic:ogbn-mag
    python experiments/scale_studies.py --transfer --datasets synthetic:bgs,synthetic:am
    python experiments/scale_studies.py --report     # the tables of studies.jsonl and transfer.jsonl
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from datetime import timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, append_jsonl, parser, read_jsonl  # noqa: E402 - experiments/ is not a package

from rgtune.db.trial_result import TrialDetails  # noqa: E402

SCALE = RESULTS / "scale"


def _tune(model: str, dataset: str, args: Any) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "rgtune.cli", "tune", "--model", model, "--dataset", dataset, "--hidden",
           str(args.hidden), "--trials", str(args.trials), "--backend", "cpu", "--db", args.db, "--seed",
           str(args.seed), "--quiet", "--time-budget", str(args.time_budget), *(["--fresh"] if args.fresh else [])]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    print(f"{model} {dataset}: rc {r.returncode} in {time.time() - t0:.1f} s", flush=True)
    return {"model": model, "dataset": dataset, "trials": args.trials, "wall_s": round(time.time() - t0, 1),
            "started": t0, "rc": r.returncode, "summary": r.stdout.strip().splitlines()[-12:],
            "stderr": r.stderr.strip()[-2000:]}


def _trial_costs(db_url: str, model: str, dataset: str, since: float) -> dict[str, Any]:
    """From the database: statuses, default/best, and per verified trial the shares of its wall time, of the
    trials started after ``since`` (seconds since the epoch: the study's own)."""
    from rgtune.db import TrialDatabase

    for attempt in range(5):  # twice the database read as malformed right after a study's process ended
        try:
            db = TrialDatabase(db_url)
            break
        except Exception as e:  # noqa: BLE001 - retried, then raised
            print(f"opening {db_url} failed ({e}); again in 10 s", file=sys.stderr)
            if attempt == 4:
                raise
            time.sleep(10)
    with db:
        trials = [t for t in db.history() if t.model == model and t.dataset == dataset and t.mode == "inference"
                  and _epoch(t.started_at) >= since]
        best = db.best(trials[0].workload_id) if trials else None
    search = [t for t in trials if t.confirmation_id is None]
    shares, peaks, covered = [], [], None
    for t in search:
        d = t.details or TrialDetails()
        if t.status == "ok" and d.elapsed_s:
            shares.append(((t.compile_s or 0.0) + (d.verify_seconds or 0.0)) / d.elapsed_s)
            covered = d.to_json().get("verified", covered)
        if t.peak_bytes is not None and not d.memory.refused:
            peaks.append(t.peak_bytes)
    ok = [(t.details or TrialDetails()).elapsed_s or 0.0 for t in search if t.status == "ok" and t.median_ms is not None]
    default = min(search, key=lambda t: t.id) if search else None  # a fresh study measures the default first
    return {"statuses": {s: sum(t.status == s for t in search) for s in {t.status for t in search}},
            "default_ms": default and default.median_ms, "default_status": default and default.status,
            "default_first_run_ms": default and (default.details or TrialDetails()).first_run_ms,
            "best_ms": best and best.median_ms,
            "compile_verify_share_median": statistics.median(shares) if shares else None,
            "compile_verify_share_max": max(shares, default=None), "verified": covered,
            "peak_gb_max": max(peaks) / 2**30 if peaks else None,
            "trial_wall_s_median": statistics.median(ok) if ok else None}


def _epoch(when: Any) -> float:
    """A recorded time (naive datetimes are UTC) in seconds since the epoch."""
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


def _transfer(db_url: str, dataset: str, big: list[str]) -> dict[str, Any]:
    """`rgtune costmodel --eval --holdout dataset`, the model trained without the other big graphs' trials."""
    from rgtune.costmodel import evaluate_holdout
    from rgtune.db import TrialDatabase

    with TrialDatabase(db_url) as db:
        r = evaluate_holdout(db, dataset, exclude=lambda w: w.dataset in big)
    print(f"{dataset}: {r.status}; {r.last_line()}", flush=True)
    return {"dataset": dataset, "json": r.as_dict()}


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.3g}"


def report() -> str:
    """BENCHMARKS.md's study table and the transfer's metrics, from studies.jsonl and transfer.jsonl."""
    out = ["| model | dataset | study wall | trials: statuses | default -> best ms | compile+verify share of a "
           "trial (median / max) | trial wall (median) | peak per trial | verified |", "|" + "---|" * 9]
    for r in {(r["model"], r["dataset"]): r for r in read_jsonl(SCALE / "studies.jsonl")}.values():  # latest run
        v, share = r.get("verified") or {}, r.get("compile_verify_share_median")
        default = _ms(r.get("default_ms")) if r.get("default_status", "ok") == "ok" else r["default_status"]
        if r.get("default_first_run_ms") is not None and r.get("default_status") == "stopped":
            default += f" (first run {_ms(r['default_first_run_ms'])})"
        out.append(" | ".join([
            f"| {r['model']}", r["dataset"], f"{r['wall_s'] / 60:.1f} min",
            ", ".join(f"{k} {n}" for k, n in sorted(r.get("statuses", {}).items())),
            f"{default} -> {_ms(r.get('best_ms'))}",
            "–" if share is None else f"{share:.0%} / {r['compile_verify_share_max']:.0%}",
            f"{_ms(r.get('trial_wall_s_median'))} s", f"{_ms(r.get('peak_gb_max'))} GiB",
            "all rows" if v.get("rows") == "all" else f"{v.get('rows')} rows, {v.get('edges', 0):,} edges"]) + " |")
    for r in read_jsonl(SCALE / "transfer.jsonl"):
        j = r["json"]
        out.append(f"\ntransfer to {j['holdout']} (trained on {j['n_train']} trials of {j['n_train_workloads']} "
                   f"other workloads): " + ", ".join(f"{k} {v:.3f}" for k, v in j["metrics"].items()) + "; " +
                   "; ".join(f"{w['model']}: opa {w['opa']:.3f}, top-1 error {w['top1_error']:.3f}"
                             for w in j["per_workload"]))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, "models", "hidden", models="rgcn,rgat,hgt")
    p.add_argument("--datasets", default="synthetic:bgs,synthetic:am,synthetic:ogbn-mag",
                   help="comma-separated presets (default the three)")
    p.add_argument("--trials", type=int, default=30, help="tune --trials (default 30)")
    p.add_argument("--seed", type=int, default=0, help="tune --seed (default 0)")
    p.add_argument("--time-budget", type=float, default=1200.0, help="tune --time-budget: seconds (default 1200)")
    p.add_argument("--db", default=f"sqlite:///{SCALE / 'results.db'}",
                   help="the trial database, an SQLite file (default experiments/results/scale/results.db)")
    p.add_argument("--fresh", action="store_true", help="tune --fresh: start new studies")
    p.add_argument("--transfer", action="store_true", help="rank each big graph's schedules zero-shot instead")
    p.add_argument("--report", action="store_true", help="only print the tables of the JSON lines")
    args = p.parse_args(argv)
    datasets = args.datasets.split(",")
    if args.report:
        print(report())
    elif args.transfer:
        for dataset in datasets:
            append_jsonl(SCALE / "transfer.jsonl", _transfer(args.db, dataset, datasets))
    else:
        for dataset in datasets:
            for model in args.models.split(","):
                row = _tune(model, dataset, args)
                row.update(_trial_costs(args.db, model, dataset, row["started"]),
                           threads=os.environ.get("OMP_NUM_THREADS", "default"))
                append_jsonl(SCALE / "studies.jsonl", row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
