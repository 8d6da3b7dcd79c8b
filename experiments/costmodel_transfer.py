"""Cost-model transfer: train on other graphs' history, rank a graph with zero trials of its own.

``--collect`` fills a history database through the tuning loop: a random-sampler study per (model,
real graph), the test set when that graph is held out, and a TPE study per (model, synthetic graph)
with the statistics of other datasets, which is what a user's history looks like; ``--repeat-real R``
then measures every real-graph schedule R more times in interleaved rounds (a schedule's true time is
the median of its measurements). The evaluation holds out each real graph in turn: the tuner's
default model, trained on the other graphs' trials of the same device and backend, ranks the
held-out graph's schedules (ordered pair accuracy, Kendall's tau, top-1 and top-5 error, also against
each schedule's first measurement alone; ``rgtune costmodel --eval`` prints the same metrics).
``--retime-rounds N`` times the zero-shot pick and the history's 3 fastest schedules of each held-out
workload again side by side. Writes ``costmodel_transfer.csv`` and ``costmodel_transfer_retimed.csv``.

Examples::

    python experiments/costmodel_transfer.py --collect --no-eval --seed 23 --repeat-real 5 --db sqlite:///h.db
    python experiments/costmodel_transfer.py --db sqlite:///h.db --retime-rounds 7 --out /tmp/transfer
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from rgtune.costmodel import CostModel, GraphLoader, evaluate_holdout, ranking_metrics
from rgtune.db import TrialDatabase, WorkloadRecord
from rgtune.tuner.measure import Workload, measure_rounds, median_ok

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _parallel import jobs_problem, run_parallel  # noqa: E402 - experiments/ is not a package

REAL = ("aifb", "mutag")
SYNTHETIC = ("synthetic:bgs,scale=0.1", "synthetic:am,scale=0.01", "synthetic:ogbn-mag,scale=0.003,reverse=1",
             "synthetic:custom,nodes=20000,edges=100000,ntypes=4,rels=20,degree_skew=1.5")
MODELS = ("rgat", "hgt")
RESULTS = Path(__file__).resolve().parent / "results"


# ---------------------------------------------------------------------- collection
def canonical_dataset(name: str, data_dir: str | None = None) -> str:
    """The name the database records for ``name`` (a synthetic spec drops its default fields)."""
    from rgtune.data import load_dataset

    return load_dataset(name, root=data_dir).name


def collect(db_url: str, models: Sequence[str], real: Sequence[str], synthetic: Sequence[str], *, real_trials: int,
            synthetic_trials: int, hidden: int, backend: str, data_dir: str | None, seed: int = 11,
            repeat_real: int = 0, jobs: int = 1) -> None:
    """Run the studies that make the history (resumable), ``jobs`` at a time, then the repeats."""
    plan = [(ds, m, "random", real_trials) for ds in real for m in models]
    plan += [(ds, m, "tpe", synthetic_trials) for ds in synthetic for m in models]
    TrialDatabase(db_url).close()  # created (and migrated) once, before the jobs open it side by side
    run_parallel(_collect_study, [(db_url, *entry, hidden, backend, data_dir, seed) for entry in plan], jobs)
    if repeat_real > 0:
        with TrialDatabase(db_url) as db:
            repeats = [(db_url, w, ds, repeat_real, data_dir) for ds, model, _, _ in plan[:len(real) * len(models)]
                       for w in db.workloads(model=model, in_dim=hidden, backend=backend,
                                             dataset=canonical_dataset(ds, data_dir))]
        run_parallel(repeat_schedules, repeats, jobs)


def _collect_study(db_url: str, ds: str, model: str, sampler: str, trials: int, hidden: int, backend: str,
                   data_dir: str | None, seed: int) -> None:
    from rgtune.tuner.study import TuneOptions, Tuner

    with TrialDatabase(db_url) as db:
        done = sum(w.num_trials for w in db.workloads(model=model, in_dim=hidden, backend=backend,
                                                      dataset=canonical_dataset(ds, data_dir)))
        if done >= trials:
            return
        t0 = time.time()
        # confirm_top=0: the history holds the studies' own measurements (and --repeat-real's rounds)
        s = Tuner(Workload(model, ds, hidden, hidden, 1, backend, data_dir), db,
                  TuneOptions(trials=trials - done, sampler=sampler, seed=seed, progress=False, confirm_top=0)).run()
    print(f"collected {model} on {ds}: {s.trials_run} trials ({sampler}) in {time.time() - t0:.0f} s, "
          f"best {s.best_ms} ms", flush=True)


def repeat_schedules(db_url: str, w: WorkloadRecord, dataset: str, repeats: int, data_dir: str | None) -> None:
    """Measure every ``ok`` schedule of ``w`` until it has ``1 + repeats`` measurements, in interleaved
    rounds, each measurement a trial of the history (resumable)."""
    from rgtune.tuner.study import record_measurement

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
        measure_rounds(Workload(w.model, dataset, w.in_dim, w.out_dim, w.heads, w.backend, data_dir), short, rounds,
                       on_result=lambda name, rnd, result: record_measurement(db, db.start_trial(w, short[name]),
                                                                              result))
    print(f"repeated {len(short)} schedules of {w.model} on {dataset} in {rounds} interleaved rounds "
          f"({time.time() - t0:.0f} s)", flush=True)


# ---------------------------------------------------------------------- evaluation
def evaluate(db_url: str, holdouts: Sequence[str], models: Sequence[str], data_dir: str | None, out: Path,
             retime_rounds: int = 0) -> list[dict[str, Any]]:
    """Per held-out workload, the default model's metrics, and with ``retime_rounds`` its re-timed pick."""
    graphs = GraphLoader(data_dir)
    rows: list[dict[str, Any]] = []
    retimed: list[dict[str, Any]] = []
    with TrialDatabase(db_url) as db:
        for holdout in holdouts:
            try:
                r = evaluate_holdout(db, holdout, cost_model=CostModel(), graphs=graphs, keep_predictions=True)
            except ValueError as e:
                print(f"skip {holdout}: {e}")
                continue
            for w in (w for w in r.per_workload if w["model"] in models):
                first = ranking_metrics(w["pred"], w["first"])  # each schedule's first measurement as its time
                rows.append({"holdout": holdout, "model": w["model"], "n_train": r.n_train,
                             "train_workloads": r.n_train_workloads, "schedules": w["schedules"],
                             "measurements": w["measurements"],
                             **{k: w[k] for k in ("opa", "kendall_tau", "top1_error", "top5_error")},
                             **{f"{k}_first": first[k] for k in ("opa", "top1_error")}})
                print(f"{holdout:<6} {w['model']:<5} train={r.n_train:<5} opa={w['opa']:.3f} "
                      f"tau={w['kendall_tau']:.3f} top1={w['top1_error']:.3f} top5={w['top5_error']:.3f} (first "
                      f"measurement only: opa={first['opa']:.3f} top1={first['top1_error']:.3f})", flush=True)
                if retime_rounds > 0:
                    retimed += _retime(db.workloads(workload_id=w["workload_id"])[0], holdout, w, retime_rounds, 3,
                                       data_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "costmodel_transfer.csv", rows)
    write_csv(out / "costmodel_transfer_retimed.csv", retimed)
    return rows


def _retime(rec: WorkloadRecord, holdout: str, w: dict[str, Any], rounds: int, top: int, data_dir: str | None
            ) -> list[dict[str, Any]]:
    """The pick and the ``top`` fastest schedules of one held-out workload, timed again side by side (the
    history's top-1 error compares single measurements, and the best of 60 of them is biased low)."""
    true, pred = np.asarray(w["true"]), np.asarray(w["pred"])
    names = {int(j): f"best{i + 1}" for i, j in enumerate(np.argsort(true)[:top])}
    pick = int(np.argmin(pred))
    pick_name = names.setdefault(pick, "pick")
    configs = {name: w["knobs"][i] for i, name in names.items()}
    seconds = measure_rounds(Workload(rec.model, holdout, rec.in_dim, rec.out_dim, rec.heads, rec.backend, data_dir),
                             configs, rounds)
    medians = {n: m * 1e3 for n, v in seconds.items() if (m := median_ok(v)) is not None}
    error = (medians[pick_name] / min(medians.values()) - 1) if pick_name in medians else math.inf
    print(f"re-timed {holdout} {rec.model}: pick {pick_name}; top-1 error in the history "
          f"{float(true[pick] / true.min() - 1):.3f}, re-timed against the history's {top} fastest {error:.3f}")
    return [{"holdout": holdout, "model": rec.model, "schedule": name, "is_pick": name == pick_name,
             "history_ms": float(true[i]), "retimed_ms": medians.get(name),
             "rounds_ms": [None if t is None else round(t * 1e3, 4) for t in seconds[name]],
             "knobs": json.dumps(configs[name], sort_keys=True)} for i, name in names.items()]


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """Rows of dicts as CSV (the union of their keys; floats with 4 decimals); nothing for no rows."""
    if rows:
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
            w.writeheader()
            w.writerows({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows)


# ---------------------------------------------------------------------- command line
def split_names(text: str) -> list[str]:
    """A list option: ';'-separated, or ','-separated when it holds no synthetic spec (those hold commas).

    Example:
        >>> split_names("aifb,mutag"), split_names("synthetic:custom,nodes=9;aifb")
        (['aifb', 'mutag'], ['synthetic:custom,nodes=9', 'aifb'])
    """
    sep = ";" if ";" in text or "synthetic:" in text else ","
    return [t for t in (x.strip() for x in text.split(sep)) if t]


def set_threads(threads: int | None) -> None:
    """Pin the measured kernels' OpenMP threads (the measurement workers inherit the environment; the
    device's fingerprint records the count). On a busy shared machine 1 thread is the stable choice."""
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)


def default_backend() -> str:
    from rgtune.codegen.base import available_backends

    return "cpu" if available_backends().get("cpu", (False, ""))[0] else "reference"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("Examples::")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", default="sqlite:///cm_history.db", help="the history (default sqlite:///cm_history.db)")
    p.add_argument("--collect", action="store_true", help="run the studies that fill the history first")
    p.add_argument("--no-eval", action="store_true", help="only collect")
    p.add_argument("--models", default=",".join(MODELS), help="models (default rgat,hgt)")
    p.add_argument("--real", default=",".join(REAL), help="real graphs: collected with random search, held out in turn")
    p.add_argument("--synthetic", default=";".join(SYNTHETIC), help="synthetic graphs, ';'-separated")
    p.add_argument("--real-trials", type=int, default=60, help="random trials per (model, real graph) (default 60)")
    p.add_argument("--synthetic-trials", type=int, default=40, help="TPE trials per (model, synthetic graph)")
    p.add_argument("--repeat-real", type=int, default=0, metavar="R",
                   help="--collect: measure each schedule of the real graphs R more times (default 0)")
    p.add_argument("--seed", type=int, default=11, help="--collect: the studies' sampler seed (default 11)")
    p.add_argument("--hidden", type=int, default=64, help="feature size (default 64)")
    p.add_argument("--backend", default=None, help="cpu (default when usable), else reference; cuda on a GPU")
    p.add_argument("--data-dir", default=None, help="dataset root (default $RGTUNE_DATA_DIR)")
    p.add_argument("--threads", type=int, default=None, help="OpenMP threads of the measured kernels")
    p.add_argument("--jobs", type=int, default=1, help="--collect: studies side by side (GPU backends only)")
    p.add_argument("--out", default=str(RESULTS), help="where results go (default experiments/results)")
    p.add_argument("--retime-rounds", type=int, default=0, help="re-time the zero-shot pick and the held-out "
                   "graph's 3 fastest schedules in this many interleaved rounds (default 0: off)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    models, real, synthetic = split_names(args.models), split_names(args.real), split_names(args.synthetic)
    backend = args.backend or default_backend()
    set_threads(args.threads)
    t0 = time.time()
    if args.collect:
        if problem := jobs_problem(args.jobs, backend):
            raise SystemExit(f"costmodel_transfer: {problem}")
        collect(args.db, models, real, synthetic, real_trials=args.real_trials, synthetic_trials=args.synthetic_trials,
                hidden=args.hidden, backend=backend, data_dir=args.data_dir, seed=args.seed,
                repeat_real=args.repeat_real, jobs=args.jobs)
        print(f"collection done in {time.time() - t0:.0f} s")
    if not args.no_eval:
        evaluate(args.db, [canonical_dataset(h, args.data_dir) for h in real], models, args.data_dir, Path(args.out),
                 args.retime_rounds)
    print(f"total {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
