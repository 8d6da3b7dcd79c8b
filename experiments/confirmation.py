"""What the end-of-run confirmation buys: the schedule `tune` returns with it, against the fastest single measurement.

Makes BENCHMARKS.md's table "What `tune` returns: the end-of-run confirmation". Per (model, dataset, seed):
one `tune` run (TPE, the cost model off, --trials, a database of its own) ending with its confirmation
(the --confirm fastest schedules timed again in --confirm-rounds interleaved rounds); then, in a fresh
measurement process, --retime-rounds rounds time the confirmed schedules again, among them *single* (the
fastest single measurement: what `tune --confirm 0` returns) and *confirmed* (what `rgtune best` returns).
Writes confirmation.csv (per run), confirmation_retimed.csv (each schedule's rounds) and confirmation.json
(medians over seeds) to --out.

Examples::

    python experiments/confirmation.py --seeds 5
    python experiments/confirmation.py --models rgat --datasets aifb --seeds 1 --trials 12 --out /tmp/c
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

from rgtune.db import TrialDatabase
from rgtune.tuner import TuneOptions, Tuner, Workload
from rgtune.tuner.measure import median_ok

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import canonical_dataset, parser, rounds_ms, setup, split_names, write_csv  # noqa: E402


def one_run(model: str, dataset: str, seed: int, args: Any, backend: str, workdir: Path
            ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Tune, confirm, re-time the two answers; the run's row and the re-timed schedules' rows."""
    db = TrialDatabase(f"sqlite:///{workdir / f'{model}-{dataset}-s{seed}.db'}")
    workload = Workload(model, dataset, args.hidden, args.hidden, 1, backend, args.data_dir)
    summary = Tuner(workload, db, TuneOptions(trials=args.trials, sampler="tpe", seed=seed, progress=False,
                                              confirm_top=args.confirm, confirm_rounds=args.confirm_rounds)).run()
    c = summary.confirmation
    if c is None or not c.finished:
        raise SystemExit(f"{model} on {dataset}, seed {seed}: no finished confirmation ({summary.statuses})")
    trials = db.history()
    single = min((t for t in trials if t.status == "ok" and t.confirmation_id is None),
                 key=lambda t: (t.median_ms, t.id))
    confirmed = db.best()
    assert confirmed is not None
    rounds = rounds_ms(workload, {t.schedule_hash: t.knobs for t in trials if t.confirmation_id == c.id},
                       args.retime_rounds)
    retimed = {h: m for h, v in rounds.items() if (m := median_ok(v)) is not None}
    row = {"model": model, "dataset": dataset, "seed": seed, "trials": summary.measured,
           "search_s": summary.elapsed_s - c.elapsed_s, "confirm_s": c.elapsed_s, "confirmed_schedules": c.schedules,
           "same_schedule": single.schedule_hash == confirmed.schedule_hash,
           "single_measured_ms": single.median_ms, "confirmed_ms": confirmed.median_ms,
           "single_retimed_ms": retimed.get(single.schedule_hash),
           "confirmed_retimed_ms": retimed.get(confirmed.schedule_hash), "fastest_retimed_ms": min(retimed.values())}
    for a, b in (("single", "confirmed"), ("confirmed", "fastest"), ("single", "fastest")):
        x, y = row[f"{a}_retimed_ms"], row[f"{b}_retimed_ms"]
        row[f"{a}_over_{b}"] = None if x is None or y is None or y <= 0 else x / y
    for a, reported in (("single", single.median_ms), ("confirmed", confirmed.median_ms)):
        row[f"{a}_reported_over_retimed"] = reported / row[f"{a}_retimed_ms"] if row[f"{a}_retimed_ms"] else None
    detail = [{"model": model, "dataset": dataset, "seed": seed, "schedule_hash": h,
               "is_single": h == single.schedule_hash, "is_confirmed": h == confirmed.schedule_hash,
               "retimed_ms": retimed.get(h), "rounds_ms": [None if t is None else round(t, 4) for t in v]}
              for h, v in rounds.items()]
    db.close()
    return row, detail


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians over seeds per (model, dataset)."""
    out = []
    for key in sorted({(r["model"], r["dataset"]) for r in rows}):
        sel = [r for r in rows if (r["model"], r["dataset"]) == key]
        med = {f"median_{k}": statistics.median(v) if (v := [r[k] for r in sel if r[k] is not None]) else None
               for k in ("single_over_confirmed", "single_over_fastest", "confirmed_over_fastest", "search_s",
                         "confirm_s", "single_reported_over_retimed", "confirmed_reported_over_retimed")}
        out.append({"model": key[0], "dataset": key[1], "runs": len(sel),
                    "different_pick": sum(not r["same_schedule"] for r in sel), **med})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = parser(__doc__, "models", "datasets", "hidden", "backend", "data-dir", "threads", "out")
    p.add_argument("--seeds", type=int, default=3, help="runs per (model, dataset), seeds 0.. (default 3)")
    p.add_argument("--trials", type=int, default=50, help="measured trials of the search (default 50, as tune)")
    p.add_argument("--confirm", type=int, default=TuneOptions.confirm_top,
                   help=f"schedules confirmed (default {TuneOptions.confirm_top}, as tune)")
    p.add_argument("--confirm-rounds", type=int, default=TuneOptions.confirm_rounds,
                   help=f"rounds of the confirmation (default {TuneOptions.confirm_rounds}, as tune)")
    p.add_argument("--retime-rounds", type=int, default=7, help="rounds of the independent re-timing (default 7)")
    args = p.parse_args(argv)
    backend = setup(p, args)
    datasets = [canonical_dataset(d, args.data_dir) for d in split_names(args.datasets)]
    rows: list[dict[str, Any]] = []
    detail: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rgtune-confirmation-") as tmp:
        for dataset, model, seed in ((d, m, s) for d in datasets for m in split_names(args.models)
                                     for s in range(args.seeds)):
            row, d = one_run(model, dataset, seed, args, backend, Path(tmp))
            rows.append(row)
            detail.extend(d)
            print(f"{model} {dataset} seed {seed}: single {row['single_retimed_ms']:.3f} ms, confirmed "
                  f"{row['confirmed_retimed_ms']:.3f} ms, fastest {row['fastest_retimed_ms']:.3f} ms (re-timed); "
                  f"search {row['search_s']:.0f} s, confirmation {row['confirm_s']:.0f} s", flush=True)
    summary = summarize(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "confirmation.csv", rows)
    write_csv(args.out / "confirmation_retimed.csv", detail)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "data_dir")}
    (args.out / "confirmation.json").write_text(json.dumps({"settings": settings, "backend": backend,
                                                            "summary": summary}, indent=1))
    for s in summary:
        print(f"{s['model']} {s['dataset']}: {s['runs']} runs, a different pick in {s['different_pick']}; median "
              f"single/confirmed {s['median_single_over_confirmed']:.3f}, single/fastest "
              f"{s['median_single_over_fastest']:.3f}, confirmed/fastest {s['median_confirmed_over_fastest']:.3f}; "
              f"reported/re-timed: single {s['median_single_reported_over_retimed']:.3f}, confirmed "
              f"{s['median_confirmed_reported_over_retimed']:.3f}; search {s['median_search_s']:.0f} s, confirmation "
              f"{s['median_confirm_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
