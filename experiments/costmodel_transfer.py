"""Cost-model transfer: repeat the history's real-graph schedules, and re-time the zero-shot pick of each held-out graph.

Makes, with `rgtune costmodel --eval`, the transfer tables of BENCHMARKS.md's "Learned cost model on the CPU"
and "on the GPU" (the `tune` studies that collect the history are there and in gpu_costmodel.sh).
--repeat-real R measures every `ok` schedule of the --real graphs R more times in interleaved rounds, each
measurement a trial of the history (resumable): a schedule's true time is the median of its measurements.
Then each real graph is held out in turn: the tuner's default model, trained on the other graphs' trials of
the device and backend, ranks its schedules (the metrics of `rgtune costmodel --eval --holdout`), and
--retime-rounds N times the zero-shot pick and the history's 3 fastest schedules again side by side (the best
of 60 single measurements is biased low). Writes costmodel_transfer.csv and costmodel_transfer_retimed.csv.

Examples::

    python experiments/costmodel_transfer.py --repeat-real 5 --no-eval --db sqlite:///cm_history_s23.db
    python experiments/costmodel_transfer.py --db sqlite:///cm_history_s23.db --retime-rounds 7 --out /tmp/transfer
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from rgtune.costmodel import CostModel, GraphLoader, evaluate_holdout
from rgtune.db import TrialDatabase, WorkloadRecord
from rgtune.tuner import Workload
from rgtune.tuner.measure import median_ok

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import canonical_dataset, parser, rounds_ms, run_parallel, setup, split_names, write_csv  # noqa: E402


def repeat_schedules(db_url: str, w: WorkloadRecord, dataset: str, repeats: int, data_dir: str | None) -> None:
    """Measure every ``ok`` schedule of ``w`` until it has ``1 + repeats`` measurements, in interleaved
    rounds, each measurement a trial of the history (resumable)."""
    with TrialDatabase(db_url) as db:
        trials = [t for t in db.history(w) if t.status != "running"]
        ok = {t.schedule_hash for t in trials if t.status == "ok"}
        counts = {h: sum(t.schedule_hash == h for t in trials) for h in ok}
        knobs = {t.schedule_hash: t.knobs for t in trials if t.schedule_hash in ok}
        short = {h: knobs[h] for h, n in counts.items() if n < 1 + repeats}
        if not short:
            return
        rounds = 1 + repeats - min(counts[h] for h in short)
        t0 = time.time()
        workload = Workload(w.model, dataset, w.in_dim, w.out_dim, w.heads, w.backend, data_dir, w.mode, w.options,
                            precision=w.precision)  # a training workload's schedules are timed as training steps
        rounds_ms(workload, short, rounds,
                  on_result=lambda name, rnd, result: db.record_result(db.start_trial(w, short[name]), result))
    print(f"repeated {len(short)} schedules of {w.model} ({w.mode}) on {dataset} in {rounds} interleaved rounds "
          f"({time.time() - t0:.0f} s)", flush=True)


def evaluate(db_url: str, holdouts: Sequence[str], models: Sequence[str], data_dir: str | None, out: Path,
             retime_rounds: int = 0) -> list[dict[str, Any]]:
    """Per held-out workload, the default model's metrics, and with ``retime_rounds`` its re-timed pick."""
    graphs = GraphLoader(data_dir)
    rows: list[dict[str, Any]] = []
    retimed: list[dict[str, Any]] = []
    with TrialDatabase(db_url) as db:
        for holdout in holdouts:
            r = evaluate_holdout(db, holdout, cost_model=CostModel(), graphs=graphs, keep_predictions=True)
            for w in (w for w in r.per_workload if w["model"] in models):
                metrics = {k: w[k] for k in ("opa", "kendall_tau", "top1_error", "top5_error")}
                rows.append({"holdout": holdout, "model": w["model"], "n_train": r.n_train,
                             "train_workloads": r.n_train_workloads, "schedules": w["schedules"],
                             "measurements": w["measurements"], **metrics})
                print(f"{holdout:<6} {w['model']:<5} train={r.n_train:<5} "
                      + " ".join(f"{k}={v:.3f}" for k, v in metrics.items()), flush=True)
                if retime_rounds > 0:
                    retimed += _retime(db.workloads(workload_id=w["workload_id"])[0], holdout, w, retime_rounds, 3,
                                       data_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "costmodel_transfer.csv", rows)
    write_csv(out / "costmodel_transfer_retimed.csv", retimed)
    return rows


def _retime(rec: WorkloadRecord, holdout: str, w: dict[str, Any], rounds: int, top: int, data_dir: str | None
            ) -> list[dict[str, Any]]:
    """The pick and the ``top`` fastest schedules of one held-out workload, timed again side by side."""
    true, pred = np.asarray(w["true"]), np.asarray(w["pred"])
    names = {int(j): f"best{i + 1}" for i, j in enumerate(np.argsort(true)[:top])}
    pick = int(np.argmin(pred))
    pick_name = names.setdefault(pick, "pick")
    configs = {name: w["knobs"][i] for i, name in names.items()}
    times = rounds_ms(Workload(rec.model, holdout, rec.in_dim, rec.out_dim, rec.heads, rec.backend, data_dir),
                      configs, rounds)
    medians = {n: m for n, v in times.items() if (m := median_ok(v)) is not None}
    error = (medians[pick_name] / min(medians.values()) - 1) if pick_name in medians else math.inf
    print(f"re-timed {holdout} {rec.model}: pick {pick_name}; top-1 error in the history "
          f"{float(true[pick] / true.min() - 1):.3f}, re-timed against the history's {top} fastest {error:.3f}")
    return [{"holdout": holdout, "model": rec.model, "schedule": name, "is_pick": name == pick_name,
             "history_ms": float(true[i]), "retimed_ms": medians.get(name),
             "rounds_ms": [None if t is None else round(t, 4) for t in times[name]],
             "knobs": json.dumps(configs[name], sort_keys=True)} for i, name in names.items()]


def main(argv: Sequence[str] | None = None) -> int:
    p = parser(__doc__, "models", "hidden", "backend", "data-dir", "threads", "jobs", "out", models="rgat,hgt")
    p.add_argument("--db", default="sqlite:///cm_history.db", help="the history (default sqlite:///cm_history.db)")
    p.add_argument("--real", default="aifb,mutag", help="the real graphs: repeated, held out in turn (default aifb,mutag)")
    p.add_argument("--repeat-real", type=int, default=0, metavar="R",
                   help="first measure each schedule of the real graphs R more times (default 0)")
    p.add_argument("--no-eval", action="store_true", help="only repeat")
    p.add_argument("--retime-rounds", type=int, default=0, help="re-time the zero-shot pick and the held-out "
                   "graph's 3 fastest schedules in this many interleaved rounds (default 0: off)")
    args = p.parse_args(argv)
    models, backend = split_names(args.models), setup(p, args)
    real = [canonical_dataset(d, args.data_dir) for d in split_names(args.real)]
    t0 = time.time()
    if args.repeat_real > 0:
        with TrialDatabase(args.db) as db:
            repeats = [(args.db, w, ds, args.repeat_real, args.data_dir) for ds in real for m in models
                       for w in db.workloads(model=m, in_dim=args.hidden, backend=backend, dataset=ds)]
        run_parallel(repeat_schedules, repeats, args.jobs)
    if not args.no_eval:
        evaluate(args.db, real, models, args.data_dir, args.out, args.retime_rounds)
    print(f"total {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
