"""What the end-of-run confirmation buys: the schedule ``tune`` returns with it, against the fastest single measurement.

For each (model, dataset, seed) one tuning run (TPE, the cost model off, ``--trials`` measured trials,
a database of its own) ends with its confirmation (the ``--confirm`` fastest schedules timed again in
``--confirm-rounds`` interleaved rounds). Then, in a fresh measurement process, ``--retime-rounds``
interleaved rounds time the run's confirmed schedules again, among them ``single`` (the fastest single
measurement: what ``tune --confirm 0`` returns) and ``confirmed`` (what ``TrialDatabase.best`` returns).
Writes ``confirmation.csv`` (per run), ``confirmation_retimed.csv`` (each schedule's rounds) and
``confirmation.json`` (medians over seeds) to ``--out``.

Examples::

    python experiments/confirmation.py --seeds 5
    python experiments/confirmation.py --models rgat --datasets aifb --seeds 1 --trials 12 --out /tmp/c
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

from rgtune.db import TrialDatabase
from rgtune.tuner.measure import Workload, measure_rounds, median_ok
from rgtune.tuner.study import TuneOptions, Tuner

RESULTS = Path(__file__).resolve().parent / "results"


def one_run(model: str, dataset: str, seed: int, args: argparse.Namespace, backend: str, workdir: Path
            ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Tune, confirm, re-time the two answers; the run's row and the re-timed schedules' rows."""
    db = TrialDatabase(f"sqlite:///{workdir / f'{model}-{dataset}-s{seed}.db'}")
    workload = Workload(model, dataset, args.hidden, args.hidden, 1, backend, args.data_dir)
    opts = TuneOptions(trials=args.trials, sampler="tpe", seed=seed, progress=False, confirm_top=args.confirm,
                       confirm_rounds=args.confirm_rounds)
    summary = Tuner(workload, db, opts).run()
    c = summary.confirmation
    if c is None or not c.finished:
        raise SystemExit(f"{model} on {dataset}, seed {seed}: no finished confirmation ({summary.statuses})")
    trials = db.history()
    single = min((t for t in trials if t.status == "ok" and t.confirmation_id is None),
                 key=lambda t: (t.median_ms, t.id))
    confirmed = db.best()
    assert confirmed is not None
    schedules = {t.schedule_hash: t.knobs for t in trials if t.confirmation_id == c.id}
    seconds = measure_rounds(workload, schedules, args.retime_rounds)
    retimed = {h: m * 1e3 for h, v in seconds.items() if (m := median_ok(v)) is not None}
    fastest = min(retimed.values())
    row = {"model": model, "dataset": dataset, "seed": seed, "trials": summary.measured,
           "search_s": summary.elapsed_s - c.elapsed_s, "confirm_s": c.elapsed_s, "confirmed_schedules": c.schedules,
           "same_schedule": single.schedule_hash == confirmed.schedule_hash,
           "single_measured_ms": single.median_ms, "confirmed_ms": confirmed.median_ms,
           "single_retimed_ms": retimed.get(single.schedule_hash),
           "confirmed_retimed_ms": retimed.get(confirmed.schedule_hash), "fastest_retimed_ms": fastest}
    for a, b in (("single", "confirmed"), ("confirmed", "fastest"), ("single", "fastest")):
        x, y = row[f"{a}_retimed_ms"], row[f"{b}_retimed_ms"]
        row[f"{a}_over_{b}"] = None if x is None or y is None or y <= 0 else x / y
    detail = [{"model": model, "dataset": dataset, "seed": seed, "schedule_hash": h,
               "is_single": h == single.schedule_hash, "is_confirmed": h == confirmed.schedule_hash,
               "retimed_ms": retimed.get(h),
               "rounds_ms": [None if t is None else round(t * 1e3, 4) for t in seconds[h]]} for h in schedules]
    db.close()
    return row, detail


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians over seeds per (model, dataset)."""
    out = []
    for key in sorted({(r["model"], r["dataset"]) for r in rows}):
        sel = [r for r in rows if (r["model"], r["dataset"]) == key]
        med = {f"median_{k}": statistics.median(v) if (v := [r[k] for r in sel if r[k] is not None]) else None
               for k in ("single_over_confirmed", "single_over_fastest", "confirmed_over_fastest", "search_s",
                         "confirm_s")}
        out.append({"model": key[0], "dataset": key[1], "runs": len(sel),
                    "different_pick": sum(not r["same_schedule"] for r in sel), **med})
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("Examples::")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="hgt,rgat", help="models (default hgt,rgat)")
    p.add_argument("--datasets", default="aifb,mutag", help="datasets, ',' or ';'-separated (default aifb,mutag)")
    p.add_argument("--seeds", type=int, default=3, help="runs per (model, dataset), seeds 0.. (default 3)")
    p.add_argument("--trials", type=int, default=50, help="measured trials of the search (default 50, as tune)")
    p.add_argument("--confirm", type=int, default=TuneOptions.confirm_top,
                   help=f"schedules confirmed (default {TuneOptions.confirm_top}, as tune)")
    p.add_argument("--confirm-rounds", type=int, default=TuneOptions.confirm_rounds,
                   help=f"rounds of the confirmation (default {TuneOptions.confirm_rounds}, as tune)")
    p.add_argument("--retime-rounds", type=int, default=7, help="rounds of the independent re-timing (default 7)")
    p.add_argument("--hidden", type=int, default=64, help="feature size (default 64)")
    p.add_argument("--backend", default=None, help="cpu (default when usable), else reference")
    p.add_argument("--data-dir", default=None, help="dataset root (default $RGTUNE_DATA_DIR)")
    p.add_argument("--threads", type=int, default=None, help="OpenMP threads of the measured kernels")
    p.add_argument("--out", default=str(RESULTS), help="where results go (default experiments/results)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from costmodel_transfer import canonical_dataset, default_backend, set_threads, split_names, write_csv

    args = build_parser().parse_args(argv)
    models = split_names(args.models)
    datasets = [canonical_dataset(d, args.data_dir) for d in split_names(args.datasets)]
    backend = args.backend or default_backend()
    set_threads(args.threads)
    rows: list[dict[str, Any]] = []
    detail: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rgtune-confirmation-") as tmp:
        for dataset, model, seed in ((d, m, s) for d in datasets for m in models for s in range(args.seeds)):
            row, d = one_run(model, dataset, seed, args, backend, Path(tmp))
            rows.append(row)
            detail.extend(d)
            print(f"{model} {dataset} seed {seed}: single {row['single_retimed_ms']:.3f} ms, confirmed "
                  f"{row['confirmed_retimed_ms']:.3f} ms, fastest {row['fastest_retimed_ms']:.3f} ms (re-timed); "
                  f"search {row['search_s']:.0f} s, confirmation {row['confirm_s']:.0f} s", flush=True)
    summary = summarize(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "confirmation.csv", rows)
    write_csv(out / "confirmation_retimed.csv", detail)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "data_dir")}
    (out / "confirmation.json").write_text(json.dumps({"settings": settings, "backend": backend, "summary": summary},
                                                      indent=1))
    for s in summary:
        print(f"{s['model']} {s['dataset']}: {s['runs']} runs, a different pick in {s['different_pick']}; median "
              f"single/confirmed {s['median_single_over_confirmed']:.3f}, single/fastest "
              f"{s['median_single_over_fastest']:.3f}, confirmed/fastest {s['median_confirmed_over_fastest']:.3f}; "
              f"search {s['median_search_s']:.0f} s, confirmation {s['median_confirm_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
