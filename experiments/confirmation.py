"""What the end-of-run confirmation buys: the schedule ``tune`` returns with it, against the fastest single measurement.

For each (model, dataset, seed) one tuning run (the real loop, :class:`rgtune.tuner.study.Tuner`,
CPU kernels by default: TPE, the cost model off, ``--trials`` measured trials), in a database of its
own, ends with its confirmation: the ``--confirm`` fastest schedules timed again in
``--confirm-rounds`` interleaved rounds. Two answers of the run are then timed again side by side,
in a fresh measurement process, ``--retime-rounds`` interleaved rounds (median of each), together
with the run's other confirmed schedules:

* ``single``: the schedule of the fastest single measurement of the search: what ``tune``
  returned before confirmations existed, and still returns with ``--confirm 0``;
* ``confirmed``: what ``TrialDatabase.best`` returns after the confirmation.

Per run: ``single / confirmed`` (re-timed; > 1: the confirmation returned a faster schedule; 1 when
both are the same schedule) and ``confirmed / fastest re-timed`` (how far the confirmed answer is
from the fastest of the confirmed schedules in the independent re-timing), with what the
confirmation cost in seconds. The re-timing does not reuse the confirmation's rounds.

Outputs (``--out``, default ``experiments/results``): ``confirmation.csv`` (one row per run, each
re-timed schedule's rounds in ``confirmation_retimed.csv``) and ``confirmation.json`` (settings and
the medians over seeds).

Examples::

    python experiments/confirmation.py --help
    python experiments/confirmation.py                       # hgt,rgat x aifb,mutag, 3 seeds: ~20 min, 2 cores
    python experiments/confirmation.py --quick               # a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from rgtune.db import TrialDatabase
from rgtune.tuner.measure import MeasureOptions, Workload, measure_rounds, median_ok
from rgtune.tuner.study import TuneOptions, Tuner

RESULTS = Path(__file__).resolve().parent / "results"


def one_run(model: str, dataset: str, seed: int, args: argparse.Namespace, backend: str, workdir: Path
            ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Tune, confirm, re-time the two answers; the run's row and the re-timed schedules' rows."""
    db = TrialDatabase(f"sqlite:///{workdir / f'{model}-{dataset}-s{seed}.db'}")
    workload = Workload(model, dataset, args.hidden, args.hidden, 1, backend, args.data_dir)
    opts = TuneOptions(trials=args.trials, sampler="tpe", seed=seed, progress=False,
                       measure=MeasureOptions(timeout=args.trial_timeout), confirm_top=args.confirm,
                       confirm_rounds=args.confirm_rounds)
    summary = Tuner(workload, db, opts).run()
    c = summary.confirmation
    if c is None or not c.finished:
        raise SystemExit(f"{model} on {dataset}, seed {seed}: no finished confirmation ({summary.statuses})")
    trials = db.history()
    single = min((t for t in trials if t.status == "ok" and t.confirmation_id is None), key=lambda t: (t.median_ms, t.id))
    confirmed = db.best()
    assert confirmed is not None
    schedules = {t.schedule_hash: t.knobs for t in trials if t.confirmation_id == c.id}
    seconds = measure_rounds(workload, schedules, args.retime_rounds, MeasureOptions(timeout=args.trial_timeout))
    retimed = {h: m * 1e3 for h, v in seconds.items() if (m := median_ok(v)) is not None}
    fastest = min(retimed.values())
    row = {"model": model, "dataset": dataset, "seed": seed, "trials": summary.measured,
           "search_s": summary.elapsed_s - c.elapsed_s, "confirm_s": c.elapsed_s, "confirmed_schedules": c.schedules,
           "same_schedule": single.schedule_hash == confirmed.schedule_hash,
           "single_measured_ms": single.median_ms, "confirmed_ms": confirmed.median_ms,
           "single_retimed_ms": retimed.get(single.schedule_hash),
           "confirmed_retimed_ms": retimed.get(confirmed.schedule_hash), "fastest_retimed_ms": fastest}
    row["single_over_confirmed"] = _ratio(row["single_retimed_ms"], row["confirmed_retimed_ms"])
    row["confirmed_over_fastest"] = _ratio(row["confirmed_retimed_ms"], fastest)
    row["single_over_fastest"] = _ratio(row["single_retimed_ms"], fastest)
    detail = [{"model": model, "dataset": dataset, "seed": seed, "schedule_hash": h,
               "is_single": h == single.schedule_hash, "is_confirmed": h == confirmed.schedule_hash,
               "retimed_ms": retimed.get(h),
               "rounds_ms": [None if t is None else round(t * 1e3, 4) for t in seconds[h]]} for h in schedules]
    db.close()
    return row, detail


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians over seeds per (model, dataset)."""
    out = []
    for key in sorted({(r["model"], r["dataset"]) for r in rows}):
        sel = [r for r in rows if (r["model"], r["dataset"]) == key]

        def med(name: str) -> float | None:
            values = [r[name] for r in sel if r[name] is not None]
            return statistics.median(values) if values else None

        out.append({"model": key[0], "dataset": key[1], "runs": len(sel),
                    "different_pick": sum(not r["same_schedule"] for r in sel),
                    "median_single_over_confirmed": med("single_over_confirmed"),
                    "median_single_over_fastest": med("single_over_fastest"),
                    "median_confirmed_over_fastest": med("confirmed_over_fastest"),
                    "median_search_s": med("search_s"), "median_confirm_s": med("confirm_s")})
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("Examples::")[1])
    p.add_argument("--models", default="hgt,rgat", help="models (default hgt,rgat)")
    p.add_argument("--datasets", default="aifb,mutag", help="datasets, ',' or ';'-separated (default aifb,mutag)")
    p.add_argument("--seeds", type=int, default=3, help="runs per (model, dataset) (default 3)")
    p.add_argument("--first-seed", type=int, default=0, help="the first seed (default 0)")
    p.add_argument("--trials", type=int, default=50, help="measured trials of the search (default 50, as tune)")
    p.add_argument("--confirm", type=int, default=TuneOptions.confirm_top,
                   help=f"schedules confirmed (default {TuneOptions.confirm_top}, as tune)")
    p.add_argument("--confirm-rounds", type=int, default=TuneOptions.confirm_rounds,
                   help=f"rounds of the confirmation (default {TuneOptions.confirm_rounds}, as tune)")
    p.add_argument("--retime-rounds", type=int, default=7, help="rounds of the independent re-timing (default 7)")
    p.add_argument("--hidden", type=int, default=64, help="feature size (default 64)")
    p.add_argument("--backend", default=None, help="cpu (default when usable), else reference")
    p.add_argument("--trial-timeout", type=float, default=60.0, help="seconds per trial (default 60)")
    p.add_argument("--data-dir", default=None, help="dataset root (default $RGTUNE_DATA_DIR)")
    p.add_argument("--threads", type=int, default=None, help="OpenMP threads of the measured kernels")
    p.add_argument("--out", default=str(RESULTS), help="where results go (default experiments/results)")
    p.add_argument("--quick", action="store_true", help="a smoke run: rgat on aifb, 1 seed, 12 trials, 3 rounds")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from costmodel_transfer import canonical_dataset, default_backend, set_threads, split_names, write_csv

    args = build_parser().parse_args(argv)
    models = split_names(args.models)
    datasets = [canonical_dataset(d, args.data_dir) for d in split_names(args.datasets)]
    if args.quick:
        models, datasets = models[-1:], datasets[:1]
        args.seeds, args.trials, args.confirm_rounds, args.retime_rounds = 1, 12, 3, 3
    backend = args.backend or default_backend()
    set_threads(args.threads)
    rows: list[dict[str, Any]] = []
    detail: list[dict[str, Any]] = []
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="rgtune-confirmation-") as tmp:
        for dataset in datasets:
            for model in models:
                for seed in range(args.first_seed, args.first_seed + args.seeds):
                    row, d = one_run(model, dataset, seed, args, backend, Path(tmp))
                    rows.append(row)
                    detail.extend(d)
                    print(f"{model} {dataset} seed {seed}: single {row['single_retimed_ms']:.3f} ms, confirmed "
                          f"{row['confirmed_retimed_ms']:.3f} ms, fastest confirmed {row['fastest_retimed_ms']:.3f} ms "
                          f"(re-timed; same schedule: {row['same_schedule']}); search {row['search_s']:.0f} s, "
                          f"confirmation {row['confirm_s']:.0f} s [{time.time() - t0:.0f} s total]", flush=True)
    summary = summarize(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "confirmation.csv", rows)
    write_csv(out / "confirmation_retimed.csv", detail)
    (out / "confirmation.json").write_text(json.dumps({"settings": {k: v for k, v in vars(args).items()
                                                                    if k not in ("out", "data_dir")},
                                                       "backend": backend, "summary": summary}, indent=1))
    for s in summary:
        print(f"{s['model']} {s['dataset']}: {s['runs']} runs, a different pick in {s['different_pick']}; median "
              f"single/confirmed {s['median_single_over_confirmed']:.3f}, single/fastest "
              f"{s['median_single_over_fastest']:.3f}, confirmed/fastest {s['median_confirmed_over_fastest']:.3f}; "
              f"search {s['median_search_s']:.0f} s, confirmation {s['median_confirm_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
