"""Real-size graphs: 30-trial studies on the BGS-, AM- and ogbn-mag-sized presets, and what a trial costs.

Each study is the ``tune`` command a user runs (its own process; the cost model on, trained on whatever
history the database holds: ``--collect-small`` first fills it with random-sampler studies of the same
models on AIFB and MUTAG, so the big graphs' studies are steered by a model that never saw them).
Per study it records the wall time, the trials' statuses, the default and best schedule, and from the
trial database: the share of each trial's wall time spent compiling and verifying (the oracle's own
time; the kernels' verification run doubles as a warm-up run), the sampled verification's coverage
and the peak memory of the measuring process per trial. ``--transfer`` then measures how well the
cost model trained on the small graphs ranks the big graphs' measured schedules (ordered pair
accuracy, zero-shot top-1 error). JSON lines go to ``experiments/results/scale/``.

Examples::

    python experiments/scale_studies.py --collect-small
    python experiments/scale_studies.py --models rgcn,rgat,hgt --datasets synthetic:bgs,synthetic:am
    python experiments/scale_studies.py --transfer --datasets synthetic:bgs,synthetic:am
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "scale"
SMALL = ("aifb", "mutag")


def _tune(model: str, dataset: str, args: argparse.Namespace, trials: int, extra: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "rgtune.cli", "tune", "--model", model, "--dataset", dataset, "--hidden",
           str(args.hidden), "--trials", str(trials), "--backend", "cpu", "--db", args.db, "--seed", str(args.seed),
           "--quiet", *extra]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    row = {"model": model, "dataset": dataset, "trials": trials, "wall_s": round(time.time() - t0, 1), "started": t0,
           "rc": r.returncode, "summary": r.stdout.strip().splitlines()[-12:], "stderr": r.stderr.strip()[-2000:]}
    print(f"{model} {dataset}: rc {r.returncode} in {row['wall_s']} s", flush=True)
    return row


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
        d = t.details or {}
        wall = d.get("elapsed")
        if t.status == "ok" and wall:
            shares.append(((t.compile_s or 0.0) + d.get("verify_seconds", 0.0)) / wall)
            covered = d.get("verified", covered)
        if t.peak_bytes is not None and not d.get("memory_refused"):
            peaks.append(t.peak_bytes)
    statuses: dict[str, int] = {}
    for t in search:
        statuses[t.status] = statuses.get(t.status, 0) + 1
    ok = [t for t in search if t.status == "ok" and t.median_ms is not None]
    default = min(search, key=lambda t: t.id) if search else None  # a fresh study measures the default first
    return {"statuses": statuses, "default_ms": default.median_ms if default else None,
            "default_status": default.status if default else None,
            "default_first_run_ms": (default.details or {}).get("first_run_ms") if default else None,
            "best_ms": best.median_ms if best else None,
            "compile_verify_share_median": statistics.median(shares) if shares else None,
            "compile_verify_share_max": max(shares) if shares else None,
            "peak_gb_max": max(peaks) / 2**30 if peaks else None, "verified": covered,
            "trial_wall_s_median": statistics.median((t.details or {}).get("elapsed", 0.0) for t in ok) if ok else None}


def _epoch(when: Any) -> float:
    """A recorded time (naive datetimes are UTC) in seconds since the epoch."""
    from datetime import timezone

    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


def _transfer(db_url: str, dataset: str, big: list[str]) -> list[dict[str, Any]]:
    """The cost model trained on the small graphs' history alone ranks ``dataset``'s measured schedules: the
    evaluation runs on a copy of the database without the other big graphs' trials."""
    import shutil
    import sqlite3
    import tempfile

    src = db_url.removeprefix("sqlite:///")
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "history.db"
        con = sqlite3.connect(src)
        con.execute(f"VACUUM INTO '{copy}'")  # a consistent copy of a WAL database
        con.close()
        con = sqlite3.connect(copy)
        others = [d for d in big if d != dataset]
        con.execute(f"DELETE FROM rg_trials WHERE workload_id IN (SELECT w.id FROM rg_workloads w JOIN rg_graphs g ON "
                    f"g.id = w.graph_id WHERE g.name IN ({','.join('?' * len(others))}))", others)
        con.commit()
        con.close()
        out = Path(tmp) / "eval.json"
        r = subprocess.run([sys.executable, "-m", "rgtune.cli", "costmodel", "--eval", "--db", f"sqlite:///{copy}",
                            "--holdout", dataset, "--json", str(out)], capture_output=True, text=True)
        result = json.loads(out.read_text()) if out.exists() else None
        shutil.rmtree(Path(str(copy) + ".costmodel"), ignore_errors=True)
    print(r.stdout.strip()[-2000:], r.stderr.strip()[-1000:], file=sys.stderr)
    return [{"dataset": dataset, "trained_on": list(SMALL), "rc": r.returncode, "text": r.stdout.strip()[-3000:],
             "json": result}]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="rgcn,rgat,hgt")
    p.add_argument("--datasets", default="synthetic:bgs,synthetic:am,synthetic:ogbn-mag")
    p.add_argument("--trials", type=int, default=30)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-budget", type=float, default=1200.0, help="seconds per study (the acceptance's 20 min)")
    p.add_argument("--db", default=f"sqlite:///{RESULTS / 'results.db'}")
    p.add_argument("--collect-small", action="store_true", help="random-sampler histories on AIFB and MUTAG")
    p.add_argument("--small-trials", type=int, default=40)
    p.add_argument("--fresh", action="store_true", help="start new studies (tune --fresh)")
    p.add_argument("--transfer", action="store_true", help="rank each big graph's schedules zero-shot")
    p.add_argument("--report", action="store_true",
                   help="print the markdown tables of studies.jsonl, bench.jsonl and transfer.jsonl")
    args = p.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    models = args.models.split(",")
    datasets = args.datasets.split(",")
    if args.collect_small:
        for model in models:
            for dataset in SMALL:
                row = _tune(model, dataset, args, args.small_trials,
                            ["--sampler", "random", "--cost-model", "off", "--confirm", "0", "--stop-slower", "0"])
                _append("small_histories.jsonl", row)
        return 0
    if args.report:
        print(report())
        return 0
    if args.transfer:
        for dataset in datasets:
            for row in _transfer(args.db, dataset, datasets):
                _append("transfer.jsonl", row)
        return 0
    for dataset in datasets:
        for model in models:
            row = _tune(model, dataset, args, args.trials,
                        ["--time-budget", str(args.time_budget), *(["--fresh"] if args.fresh else [])])
            row.update(_trial_costs(args.db, model, dataset, row["started"]))
            row["threads"] = os.environ.get("OMP_NUM_THREADS", "default")
            _append("studies.jsonl", row)
    return 0


def _rows(name: str) -> list[dict[str, Any]]:
    path = RESULTS / name
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.3g}"


def report() -> str:
    """The tables of BENCHMARKS.md's section on real-size graphs, from the JSON lines."""
    out = ["| model | dataset | study wall | trials: statuses | default -> best ms | compile+verify share of a "
           "trial (median / max) | trial wall (median) | peak per trial | verified |", "|---|---|---|---|---|---|---|---|---|"]
    for r in {(r["model"], r["dataset"]): r for r in _rows("studies.jsonl")}.values():  # a re-run replaces a row
        st = ", ".join(f"{k} {v}" for k, v in sorted(r.get("statuses", {}).items()))
        v = r.get("verified") or {}
        cov = "all rows" if v.get("rows") == "all" else f"{v.get('rows')} rows, {v.get('edges', 0):,} edges"
        share = r.get("compile_verify_share_median")
        default = _ms(r.get("default_ms")) if r.get("default_status", "ok") == "ok" else r["default_status"]
        if r.get("default_first_run_ms") is not None and r.get("default_status") == "stopped":
            default += f" (first run {_ms(r['default_first_run_ms'])})"
        out.append(f"| {r['model']} | {r['dataset']} | {r['wall_s'] / 60:.1f} min | {st} | {default} -> "
                   f"{_ms(r.get('best_ms'))} | " + ("–" if share is None else
                   f"{share:.0%} / {r['compile_verify_share_max']:.0%}") +
                   f" | {_ms(r.get('trial_wall_s_median'))} s | {_ms(r.get('peak_gb_max'))} GiB | {cov} |")
    out += ["", "| model | dataset | mode | rgtune ms | PyG ms | DGL ms | speedup over the faster | peak MB: rgtune / "
            "PyG / DGL | memory vs the smaller |", "|---|---|---|---|---|---|---|---|---|"]
    ratios: dict[str, list[float]] = {"fwd": [], "fwd+bwd": []}
    mem: dict[str, list[float]] = {"fwd": [], "fwd+bwd": []}
    latest = {(r["model"], r["dataset"]): r for r in _rows("bench.jsonl")}  # a re-run replaces a row
    for r in latest.values():
        impls = r["impls"]
        for mode in ("fwd", "fwd+bwd"):
            cells, peaks = [], []
            for key in ("rgtune", "pyg", "dgl"):
                i = impls.get(key, {})
                ms = (i.get("median_ms") or {}).get(mode)
                cells.append(_ms(ms) if ms is not None else _outcome(i, r.get("impl_timeout_s")))
                pk = (i.get("peak_mb") or {}).get(mode)
                peaks.append(pk)
            ours = (impls.get("rgtune", {}).get("median_ms") or {}).get(mode)
            libs = [(impls.get(k, {}).get("median_ms") or {}).get(mode) for k in ("pyg", "dgl")]
            libs = [x for x in libs if x is not None]
            speed = f"{min(libs) / ours:.1f}x" if ours and libs else "–"
            if ours and libs:
                ratios[mode].append(min(libs) / ours)
            lib_peaks = [x for x in peaks[1:] if x]
            memcell = f"{peaks[0] / min(lib_peaks):.2f}x" if peaks[0] and lib_peaks else "–"
            if peaks[0] and lib_peaks:
                mem[mode].append(peaks[0] / min(lib_peaks))
            out.append(f"| {r['model']} | {r['dataset']} | {mode} | {' | '.join(cells)} | {speed} | "
                       f"{' / '.join('–' if x is None else f'{x:.0f}' for x in peaks)} | {memcell} |")
    for mode, xs in ratios.items():
        if xs:
            out.append(f"\n{mode}: geomean {statistics.geometric_mean(xs):.1f}x over the faster library "
                       f"({len(xs)} rows, lowest {min(xs):.1f}x)")
    for mode, xs in mem.items():
        if xs:
            out.append(f"{mode} peak memory: rgtune / the smaller library's, geomean "
                       f"{statistics.geometric_mean(xs):.2f} ({len(xs)} rows, {min(xs):.2f}-{max(xs):.2f}; "
                       f"at most 0.5 on {sum(x <= 0.5 for x in xs)})")
    for r in _rows("transfer.jsonl"):
        out.append(f"\ntransfer to {r['dataset']}: " + (r.get("text") or "").replace("\n", " / ")[:600])
    return "\n".join(out)


def _outcome(impl: dict[str, Any], limit_s: float | None) -> str:
    status = impl.get("status")
    return {"oom": "OOM", "timeout": f"> {limit_s:g} s" if limit_s else "> limit", "failed": "failed"}.get(status or "", "–")


def _append(name: str, row: dict[str, Any]) -> None:
    with open(RESULTS / name, "a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    sys.exit(main())
