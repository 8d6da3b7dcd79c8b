"""Cost-model transfer: train on other graphs' history, rank a graph with zero trials of its own.

Two steps, each resumable:

1. ``--collect`` fills a history database through the tuning loop (real CPU kernels):
   a random-sampler study per (model, real graph) -- an unbiased sample of each space, which
   is also the test set when that graph is held out -- and a TPE study per (model, synthetic
   graph) with the statistics of other datasets (BGS, AM, ogbn-mag, a skewed custom graph),
   which is what a user's history looks like. With ``--repeat-real R`` every schedule of the
   real graphs is then measured R more times in interleaved rounds, each a trial of the history.
2. the evaluation (default) holds out each real graph in turn: the model is trained on every
   other graph's trials of the same device and backend and ranks the held-out graph's
   measured schedules (a schedule's time: the median of its measurements; the metrics against
   its first measurement alone are reported beside them). It reports ordered pair accuracy, Kendall's tau, top-1/top-5 error
   and whether the top-1 pick is within 15% of the best, for a grid of regressors and targets
   (the evidence for the defaults), with ablations of the training set (no synthetic graphs;
   synthetic only) and two baselines that need no learning (the default schedule, and
   ranking by gathered bytes from the IR's counts). It also replays the pruning rule on the
   held-out trials (zero-shot, anchored at the default schedule only): how much a margin prunes
   and whether it would have pruned the best schedules.
3. ``--retime-rounds N`` (optional, measures): the default model's zero-shot pick and the held-out
   graph's ``--retime-top`` fastest schedules are timed again side by side, N interleaved rounds,
   because the history's top-1 error compares single noisy measurements.
4. ``--warm N,N,...`` (optional, no measuring): the tuning loop's situation instead of zero-shot: the
   held-out workload's first N trials (in random orders, the default schedule first) join the
   training set, weighted ``--warm-weights`` workloads' worth (``CostModel(current_weight=...)``),
   and the model ranks the rest (``costmodel_warm_start.csv``).

Outputs (``--out``, default ``experiments/results``): ``costmodel_transfer.csv`` (one row per
holdout x workload x variant), ``costmodel_transfer_pruning.csv``, ``costmodel_transfer.json``
and ``costmodel_transfer.png`` (predicted vs measured for the default model); with re-timing,
``costmodel_transfer_retimed.csv`` (each re-timed schedule's rounds and median).

Examples::

    python experiments/costmodel_transfer.py --help
    python experiments/costmodel_transfer.py --collect --db sqlite:///cm_history.db          # ~5 min, 2 cores
    python experiments/costmodel_transfer.py --collect --repeat-real 5 --db sqlite:///cm_history.db  # + ~10 min
    python experiments/costmodel_transfer.py --db sqlite:///cm_history.db                    # ~30 s
    python experiments/costmodel_transfer.py --db sqlite:///cm_history.db --retime-rounds 7  # + ~1 min
    python experiments/costmodel_transfer.py --db sqlite:///cm_history.db --warm 5,10,20,40  # + ~5 min
    python experiments/costmodel_transfer.py --collect --quick --db sqlite:///cm_quick.db    # a smoke run
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from rgtune.costmodel import (
    ESTIMATORS,
    TARGETS,
    CostModel,
    GraphLoader,
    Sample,
    WorkloadContext,
    evaluate_holdout,
    ordered_pair_accuracy,
    ranking_metrics,
)
from rgtune.tuner import _costmodel_features
from rgtune.db import TrialDatabase, WorkloadRecord
from rgtune.tuner.measure import Workload, measure_rounds, median_ok

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _parallel import jobs_problem, run_parallel  # noqa: E402 - experiments/ is not a package

REAL = ("aifb", "mutag")
SYNTHETIC = ("synthetic:bgs,scale=0.1", "synthetic:am,scale=0.01", "synthetic:ogbn-mag,scale=0.003,reverse=1",
             "synthetic:custom,nodes=20000,edges=100000,ntypes=4,rels=20,degree_skew=1.5")
MODELS = ("rgat", "hgt")
#: the tuner's model (variant, estimator, target): plotted, replayed for pruning, re-timed
DEFAULT_VARIANT = ("all_history", "hgb", "log_default")
MARGINS = (1.5, 2.0, 3.0, 5.0)
RESULTS = Path(__file__).resolve().parent / "results"


# ---------------------------------------------------------------------- collection
def canonical_dataset(name: str, data_dir: str | None = None) -> str:
    """The name the database records for ``name`` (a synthetic spec drops its default fields)."""
    from rgtune.data import load_dataset

    return load_dataset(name, root=data_dir).name


def collect(db_url: str, models: Sequence[str], real: Sequence[str], synthetic: Sequence[str], *, real_trials: int,
            synthetic_trials: int, hidden: int, backend: str, data_dir: str | None, seed: int = 11,
            repeat_real: int = 0, jobs: int = 1) -> None:
    """Run the studies that make the history (skipping those already done: resumable), ``jobs`` at a time
    (on a GPU backend; see ``_parallel``)."""
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
    """Measure every ``ok`` schedule of ``w`` until it has ``1 + repeats`` measurements, in interleaved rounds
    (:func:`measure_rounds`), each measurement a trial of the history (resumable).

    The held-out graph's schedules are the test set of the evaluation, which takes a schedule's time as the
    median of its measurements: one measurement here varies by tens of percent from run to run, and the
    fastest of 60 single measurements is biased low (the winner's curse), so a top-1 error against it is
    mostly noise.
    """
    with TrialDatabase(db_url) as db:
        _repeat(db, w, dataset, repeats, data_dir)


def _repeat(db: TrialDatabase, w: WorkloadRecord, dataset: str, repeats: int, data_dir: str | None) -> None:
    from rgtune.tuner.study import record_measurement

    trials = [t for t in db.history(w) if t.status != "running"]
    ok = {t.schedule_hash for t in trials if t.status == "ok"}
    counts: dict[str, int] = {}
    knobs: dict[str, dict[str, Any]] = {}
    for t in trials:
        if t.schedule_hash in ok:
            counts[t.schedule_hash] = counts.get(t.schedule_hash, 0) + 1
            knobs[t.schedule_hash] = t.knobs
    short = {h: knobs[h] for h, n in counts.items() if n < 1 + repeats}
    if not short:
        return
    rounds = 1 + repeats - min(counts[h] for h in short)

    def record(name: str, rnd: int, result: Any) -> None:
        record_measurement(db, db.start_trial(w, short[name]), result)

    t0 = time.time()
    measure_rounds(Workload(w.model, dataset, w.in_dim, w.out_dim, w.heads, w.backend, data_dir), short, rounds,
                   on_result=record)
    print(f"repeated {len(short)} schedules of {w.model} on {dataset} in {rounds} interleaved rounds "
          f"({time.time() - t0:.0f} s)", flush=True)


# ---------------------------------------------------------------------- evaluation
def _is_synthetic(w: WorkloadRecord) -> bool:
    return w.dataset.startswith("synthetic:")


def _variants(holdout: str, estimators: Sequence[str], targets: Sequence[str]) -> list[tuple[str, str, str, Any]]:
    """(variant, estimator, target, extra exclusion) to evaluate on one holdout."""
    out: list[tuple[str, str, str, Any]] = [("all_history", e, t, None) for e in estimators for t in targets]
    out.append(("no_synthetic", "hgb", "log_default", _is_synthetic))
    out.append(("synthetic_only", "hgb", "log_default", lambda w: not _is_synthetic(w)))
    return out


def _baselines(r_default: Any, db: TrialDatabase, graphs: GraphLoader) -> list[dict[str, Any]]:
    """Rankings that need no learning, on the schedules the default model was evaluated on."""
    from rgtune.costmodel.history import context_for, graph_stats

    rows = []
    stats = graph_stats(db)
    for w in r_default.per_workload:
        rec = db.workloads(workload_id=w["workload_id"])[0]
        name, chash, st = stats[rec.id]
        ctx: WorkloadContext = context_for(rec, name, st, graphs(name, chash))
        default = ctx.space.default()
        true = w["true"]
        # the default schedule as the pick: what not tuning at all gives
        is_default = [1.0 if all(k.get(n) == v for n, v in default.items()) else 2.0 for k in w["knobs"]]
        by_bytes = [ctx.features(k).get("num:log_bytes_gathered", math.nan) for k in w["knobs"]]
        for name_, pred in (("baseline_default_schedule", is_default), ("baseline_gathered_bytes", by_bytes)):
            rows.append({"workload_id": w["workload_id"], "model": w["model"], "variant": name_,
                         "schedules": len(true), **ranking_metrics(pred, true)})
    return rows


def _pruning_replay(entry: dict[str, Any], default_knobs_ms: float | None, pred_default: float | None) -> list[dict]:
    """Zero-shot pruning of the held-out trials, late in a study (best so far = the true best).

    Two rules: ``vs_predicted_best`` (the pruner's: a candidate's prediction against the
    prediction for the best measured schedule) and ``vs_measured_best`` (the prediction in ms,
    anchored at the measured default schedule, against the best measured time).
    """
    pred, true = np.asarray(entry["pred"]), np.asarray(entry["true"])
    ib = int(true.argmin())
    best = float(true[ib])
    near = true <= 1.05 * best
    rules = {"vs_predicted_best": pred - pred[ib]}
    if default_knobs_ms is not None and pred_default is not None:
        rules["vs_measured_best"] = np.log(default_knobs_ms) + (pred - pred_default) - np.log(best)
    out = []
    for rule, log_ratio in rules.items():
        for m in MARGINS:
            pruned = log_ratio > math.log(m)
            slow = true > m * best
            out.append({"workload_id": entry["workload_id"], "model": entry["model"], "rule": rule, "margin": m,
                        "pruned_fraction": float(pruned.mean()), "best_pruned": bool(pruned[ib]),
                        "near_best_pruned_fraction": float(pruned[near].mean()),
                        "pruned_of_slow_fraction": float(pruned[slow].mean()) if slow.any() else math.nan})
    return out


def evaluate(db_url: str, holdouts: Sequence[str], estimators: Sequence[str], targets: Sequence[str],
             data_dir: str | None, out: Path, models: Sequence[str] | None
             ) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """The grid's rows, and the default model's per-workload predictions of each holdout (for re-timing)."""
    db = TrialDatabase(db_url)
    graphs = GraphLoader(data_dir)
    rows: list[dict[str, Any]] = []
    prune_rows: list[dict[str, Any]] = []
    scatter: dict[str, Any] = {}
    default_model: dict[str, list[dict[str, Any]]] = {}
    for holdout in holdouts:
        for variant, est, target, excl in _variants(holdout, estimators, targets):
            t0 = time.time()
            try:
                r = evaluate_holdout(db, holdout, cost_model=CostModel(est, target), graphs=graphs, exclude=excl,
                                     keep_predictions=True)
            except ValueError as e:
                print(f"skip {holdout}: {e}")
                break
            r.per_workload = [w for w in r.per_workload if models is None or w["model"] in models]
            for w in r.per_workload:
                first = ranking_metrics(w["pred"], w["first"])  # the schedule's first measurement as its time
                rows.append({"holdout": holdout, "model": w["model"], "variant": variant, "estimator": est,
                             "target": target, "n_train": r.n_train, "train_workloads": r.n_train_workloads,
                             "schedules": w["schedules"], "measurements": w["measurements"],
                             **{k: w[k] for k in ("opa", "kendall_tau", "top1_error", "top5_error")},
                             "top1_within_15pct": w["top1_error"] <= 0.15,
                             **{f"{k}_first": first[k] for k in ("opa", "top1_error")}, "seconds": time.time() - t0})
                print(f"{holdout:<6} {w['model']:<5} {variant:<15} {est:<4} {target:<12} train={r.n_train:<5}"
                      f" opa={w['opa']:.3f} tau={w['kendall_tau']:.3f} top1={w['top1_error']:.3f}"
                      f" top5={w['top5_error']:.3f} (first measurement only: opa={first['opa']:.3f}"
                      f" top1={first['top1_error']:.3f})", flush=True)
            if (variant, est, target) == DEFAULT_VARIANT:
                default_model[holdout] = r.per_workload
                for w in r.per_workload:
                    scatter[f"{holdout}/{w['model']}"] = {"pred": w["pred"], "true": w["true"]}
                    d_ms, d_pred = _default_point(db, w, graphs)
                    for p in _pruning_replay(w, d_ms, d_pred):
                        prune_rows.append({"holdout": holdout, **p})
                for b in _baselines(r, db, graphs):
                    rows.append({"holdout": holdout, "estimator": "-", "target": "-", "n_train": 0,
                                 "train_workloads": 0, "top1_within_15pct": b["top1_error"] <= 0.15,
                                 "seconds": 0.0, **{k: v for k, v in b.items() if k != "workload_id"}})
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "costmodel_transfer.csv", rows)
    write_csv(out / "costmodel_transfer_pruning.csv", prune_rows)
    (out / "costmodel_transfer.json").write_text(json.dumps({"db": _display(db_url), "rows": rows,
                                                            "pruning": prune_rows}, indent=1, default=str))
    _plot(scatter, out / "costmodel_transfer.png")
    _print_summary(rows, prune_rows)
    return rows, default_model


def retime_top1(db_url: str, default_model: dict[str, list[dict[str, Any]]], *, rounds: int, top: int,
                data_dir: str | None, out: Path) -> list[dict[str, Any]]:
    """Time the default model's zero-shot pick and the history's ``top`` fastest schedules of each held-out
    workload again, ``rounds`` interleaved rounds (:func:`measure_rounds`), and compare their medians.

    The history's top-1 error compares single measurements, and the best of 60 noisy measurements is
    biased low; a pick 20% "slower" than it can be as fast when both are timed again side by side.
    """
    if not default_model:
        print(f"no re-timing: the default model {DEFAULT_VARIANT} was not evaluated")
        return []
    db = TrialDatabase(db_url)
    rows: list[dict[str, Any]] = []
    for holdout, entries in default_model.items():
        for w in entries:
            rec = db.workloads(workload_id=w["workload_id"])[0]
            true, pred = np.asarray(w["true"]), np.asarray(w["pred"])
            names = {int(j): f"best{i + 1}" for i, j in enumerate(np.argsort(true)[:top])}
            pick = int(np.argmin(pred))
            pick_name = names.setdefault(pick, "pick")
            configs = {name: w["knobs"][i] for i, name in names.items()}
            workload = Workload(rec.model, holdout, rec.in_dim, rec.out_dim, rec.heads, rec.backend, data_dir)
            t0 = time.time()
            seconds = measure_rounds(workload, configs, rounds)
            medians = {n: m * 1e3 for n, v in seconds.items() if (m := median_ok(v)) is not None}
            fastest = min(medians.values(), default=math.nan)
            for i, name in names.items():
                rows.append({"holdout": holdout, "model": rec.model, "schedule": name, "is_pick": name == pick_name,
                             "history_ms": float(true[i]), "retimed_ms": medians.get(name),
                             "rounds_ms": [None if t is None else round(t * 1e3, 4) for t in seconds[name]],
                             "knobs": json.dumps(configs[name], sort_keys=True)})
            history_err = float(true[pick] / true.min() - 1)
            retimed_err = medians[pick_name] / fastest - 1 if pick_name in medians else math.inf
            print(f"re-timed {holdout} {rec.model}: pick {pick_name}; top-1 error in the history {history_err:.3f}, "
                  f"re-timed against the history's {top} fastest {retimed_err:.3f} ({rounds} rounds, "
                  f"{time.time() - t0:.0f} s)", flush=True)
    write_csv(out / "costmodel_transfer_retimed.csv", rows)
    return rows


def warm_start(db_url: str, holdouts: Sequence[str], models: Sequence[str], *, own: Sequence[int],
               weights: Sequence[float], repeats: int, data_dir: str | None, out: Path) -> list[dict[str, Any]]:
    """The model as the tuning loop uses it: the other graphs' history plus the first trials of the tuned one.

    For each held-out workload, ``repeats`` random orders of its measured schedules (the default
    schedule always first, as in a study): train on the other graphs' history plus the first ``n``
    of them (``n`` in ``own``), with the tuned workload weighted ``current_weight`` workloads' worth
    (each of ``weights``), and rank the schedules it has not seen. Besides the ranking metrics,
    ``opa_fast``: ordered pair accuracy among the unseen schedules in the fastest half, where a
    tuner's late decisions are made.
    """
    from rgtune.costmodel.history import load_samples, matching_workloads, workload_key

    db = TrialDatabase(db_url)
    graphs = GraphLoader(data_dir)
    rows: list[dict[str, Any]] = []
    cache: dict[int, dict[str, float]] = {}
    for holdout in holdouts:
        held = [w for w in db.workloads(dataset=holdout) if w.num_ok > 0 and w.model in models]
        for w in held:
            others = [x for x in matching_workloads(db, w.backend, w.device)
                      if x.dataset != holdout and x.graph_hash != w.graph_hash]
            history = load_samples(db, others, graphs, cache)
            # one entry per schedule: its first measurement is what the loop would have learnt from, the
            # median of its measurements (with --repeat-real) is its true time when it is ranked
            by_schedule: dict[str, list[Sample]] = {}
            for s in load_samples(db, [w], graphs, cache):
                by_schedule.setdefault(s.schedule, []).append(s)
            true_ms = {h: float(np.median([s.ms for s in v])) for h, v in by_schedule.items()}
            mine = [v[0] for v in by_schedule.values()]
            default = [s for s in mine if s.is_default][:1]
            rest = [s for s in mine if s not in default]
            for rep in range(repeats):
                order = [rest[i] for i in np.random.default_rng(rep).permutation(len(rest))]
                for n in own:
                    seen, unseen = default + order[:max(n - len(default), 0)], order[max(n - len(default), 0):]
                    if len(unseen) < 5:
                        continue
                    true = np.array([true_ms[s.schedule] for s in unseen])
                    fast = true <= np.median(true)
                    for weight in weights:
                        m = CostModel(current_weight=weight).fit(history + seen, current=workload_key(w.id))
                        pred = m.predict([s.features for s in unseen])
                        rows.append({"holdout": holdout, "model": w.model, "own_trials": len(seen),
                                     "current_weight": weight, "repeat": rep, "unseen": len(unseen),
                                     **ranking_metrics(pred, true),
                                     "opa_fast": ordered_pair_accuracy(pred[fast], true[fast])})
                print(f"warm start {holdout} {w.model}: order {rep + 1}/{repeats} done", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "costmodel_warm_start.csv", rows)
    print("\nwarm start, mean over orders (own trials x current_weight):")
    for key in sorted({(r["holdout"], r["model"], r["own_trials"], r["current_weight"]) for r in rows}):
        sel = [r for r in rows if (r["holdout"], r["model"], r["own_trials"], r["current_weight"]) == key]
        mean = {k: float(np.nanmean([r[k] for r in sel])) for k in ("opa", "opa_fast", "top1_error", "top5_error")}
        print(f"  {key[0]:<6} {key[1]:<5} own={key[2]:<3} weight={key[3]:<5g} opa={mean['opa']:.3f} "
              f"opa_fast={mean['opa_fast']:.3f} top1={mean['top1_error']:.3f} top5={mean['top5_error']:.3f}")
    return rows


def _default_point(db: TrialDatabase, entry: dict[str, Any], graphs: GraphLoader) -> tuple[float | None, float | None]:
    """The held-out workload's default schedule: its measured time and its predicted score."""
    from rgtune.costmodel.history import context_for, graph_stats

    rec = db.workloads(workload_id=entry["workload_id"])[0]
    name, chash, st = graph_stats(db)[rec.id]
    default = context_for(rec, name, st, graphs(name, chash)).space.default()
    for knobs, pred, true in zip(entry["knobs"], entry["pred"], entry["true"]):
        if all(knobs.get(n) == v for n, v in default.items()):
            return true, pred
    return None, None


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """Rows of dicts as CSV (the union of their keys; floats with 4 decimals); nothing for no rows."""
    if not rows:
        return
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()})


def _display(url: str) -> str:
    # results must not carry this machine's paths: keep the file name only
    return url.rsplit("/", 1)[-1] if url.startswith("sqlite") else url.split("@")[-1]


def _plot(scatter: dict[str, Any], path: Path) -> None:
    if not scatter:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(scatter), figsize=(4 * len(scatter), 3.6), squeeze=False)
    for ax, (name, d) in zip(axes[0], sorted(scatter.items())):
        ax.scatter(d["pred"], d["true"], s=10)
        ax.set_yscale("log")
        ax.set_xlabel("predicted log(time / default)")
        ax.set_ylabel("measured ms")
        m = ranking_metrics(d["pred"], d["true"])
        ax.set_title(f"{name}: OPA {m['opa']:.2f}, top-1 +{100 * m['top1_error']:.0f}%", fontsize=9)
    fig.suptitle("held-out graph, zero trials of its own (trained on the other graphs)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _nanmean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return float(np.mean(finite)) if finite else math.nan


def _print_summary(rows: list[dict[str, Any]], prune_rows: list[dict[str, Any]]) -> None:
    print("\nmean over held-out workloads, per variant:")
    keys = sorted({(r["variant"], r["estimator"], r["target"]) for r in rows})
    for key in keys:
        sel = [r for r in rows if (r["variant"], r["estimator"], r["target"]) == key]
        m = {k: float(np.nanmean([r[k] for r in sel])) for k in ("opa", "kendall_tau", "top1_error", "top5_error")}
        within = sum(bool(r["top1_within_15pct"]) for r in sel)
        first = [r["top1_error_first"] for r in sel if "top1_error_first" in r]
        tail = (f"; first measurement only: top1={np.mean(first):.3f} top1<=15%: "
                f"{sum(e <= 0.15 for e in first)}/{len(first)}") if first else ""
        print(f"  {key[0]:<26} {key[1]:<4} {key[2]:<12} opa={m['opa']:.3f} tau={m['kendall_tau']:.3f} "
              f"top1={m['top1_error']:.3f} top5={m['top5_error']:.3f} top1<=15%: {within}/{len(sel)}{tail}")
    if prune_rows:
        print("\nzero-shot pruning replay, best so far = the true best (mean over held-out workloads):")
    for rule in sorted({r["rule"] for r in prune_rows}):
        for m in MARGINS:
            sel = [r for r in prune_rows if r["margin"] == m and r["rule"] == rule]
            print(f"  {rule} margin {m}: prunes {np.mean([r['pruned_fraction'] for r in sel]):.2f} of the schedules, "
                  f"{_nanmean([r['pruned_of_slow_fraction'] for r in sel]):.2f} of those slower than the margin; "
                  f"best pruned in {sum(r['best_pruned'] for r in sel)}/{len(sel)}; within 5% of best pruned: "
                  f"{np.mean([r['near_best_pruned_fraction'] for r in sel]):.2f}")


# ---------------------------------------------------------------------- command line
def split_names(text: str) -> list[str]:
    """A list option: ';'-separated, or ','-separated when it holds no synthetic spec (those hold commas).

    Example:
        >>> split_names("aifb,mutag"), split_names("synthetic:custom,nodes=9;aifb")
        (['aifb', 'mutag'], ['synthetic:custom,nodes=9', 'aifb'])
    """
    sep = ";" if ";" in text or "synthetic:" in text else ","
    return [t for t in (x.strip() for x in text.split(sep)) if t]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("Examples::")[1])
    p.add_argument("--db", default="sqlite:///cm_history.db", help="the history database (default sqlite:///cm_history.db)")
    p.add_argument("--collect", action="store_true", help="run the studies that fill the history first")
    p.add_argument("--no-eval", action="store_true", help="only collect")
    p.add_argument("--models", default=",".join(MODELS), help="models (default rgat,hgt)")
    p.add_argument("--real", default=",".join(REAL), help="real graphs: collected with random search, held out in turn")
    p.add_argument("--synthetic", default=";".join(SYNTHETIC),
                   help="synthetic graphs for the history, separated by ';' (default: BGS-, AM-, ogbn-mag-like, skewed)")
    p.add_argument("--holdouts", default=None, help="graphs to hold out (default: --real)")
    p.add_argument("--real-trials", type=int, default=60, help="random trials per (model, real graph) (default 60)")
    p.add_argument("--repeat-real", type=int, default=0, metavar="R",
                   help="--collect: measure each schedule of the real graphs R more times, in interleaved rounds "
                        "(the evaluation's true time of a schedule is the median of its measurements; default 0)")
    p.add_argument("--synthetic-trials", type=int, default=40, help="TPE trials per (model, synthetic graph) (default 40)")
    p.add_argument("--seed", type=int, default=11,
                   help="--collect: the studies' sampler seed (default 11, the histories so far); another seed "
                        "draws other schedules, for a history independent of the earlier ones")
    p.add_argument("--hidden", type=int, default=64, help="feature size (default 64)")
    p.add_argument("--backend", default=None, help="cpu (default when usable), else reference")
    p.add_argument("--estimators", default=",".join(sorted(ESTIMATORS)), help="regressors compared (default all)")
    p.add_argument("--targets", default=",".join(TARGETS), help="targets compared (default all)")
    p.add_argument("--data-dir", default=None, help="dataset root (default $RGTUNE_DATA_DIR)")
    p.add_argument("--threads", type=int, default=None,
                   help="OpenMP threads of the measured kernels (default: the backend's); 1 on a busy machine")
    p.add_argument("--jobs", type=int, default=1,
                   help="--collect: studies side by side (GPU backends only: the device's lock keeps their timing "
                        "apart; default 1)")
    p.add_argument("--out", default=str(RESULTS), help="where results go (default experiments/results)")
    p.add_argument("--retime-rounds", type=int, default=0,
                   help="after the evaluation, time the default model's zero-shot pick and the held-out graph's "
                        "fastest schedules again in this many interleaved rounds (default 0: off)")
    p.add_argument("--retime-top", type=int, default=3,
                   help="how many of the held-out graph's fastest measured schedules are re-timed (default 3)")
    p.add_argument("--warm", default=None, metavar="N,N,...",
                   help="also evaluate the model with the held-out workload's first N trials in its training set "
                        "(the tuning loop's situation), for each N; writes costmodel_warm_start.csv")
    p.add_argument("--warm-weights", default="1,4,12",
                   help="current_weight values compared by --warm (default 1,4,12)")
    p.add_argument("--warm-repeats", type=int, default=5, help="random trial orders per --warm setting (default 5)")
    add_count_features_argument(p)
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: rgat only, one synthetic graph, 16 trials each, hgb and log_default only")
    return p


def set_threads(threads: int | None) -> None:
    """Pin the measured kernels' OpenMP threads (the measurement workers inherit the environment).

    On a shared, busy machine a kernel with as many threads as cores waits at every barrier for
    a descheduled thread: the same schedule measured 3 ms to 355 ms. One thread is stable to
    about 30% there. The device's fingerprint records the thread count.
    """
    if threads is not None:
        import os

        os.environ["OMP_NUM_THREADS"] = str(threads)


def add_count_features_argument(p: argparse.ArgumentParser) -> None:
    """``--count-features``: the option of every evaluation that can ablate the model's count features."""
    p.add_argument("--count-features", metavar="K,K,...", default=None,
                   help="an ablation: the IR counts the model uses as features instead of the default ones "
                        f"({','.join(_costmodel_features.COUNT_KEYS)}); any key of rgtune.ir.counts.count, "
                        "e.g. add index_probes; +K,K,... adds to the default ones")


def use_count_features(text: str | None) -> None:
    """Make the feature code use the counts ``--count-features`` names (nothing when None).

    The feature code reads ``COUNT_KEYS`` on every row, so the whole evaluation sees the ablation.
    """
    if not text:
        return
    names = split_names(text.removeprefix("+"))
    if text.startswith("+"):
        names = [*_costmodel_features.COUNT_KEYS, *(n for n in names if n not in _costmodel_features.COUNT_KEYS)]
    _costmodel_features.COUNT_KEYS = _count_keys(names)
    print(f"count features: {', '.join(_costmodel_features.COUNT_KEYS)}")


def _count_keys(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` if each is a number :func:`rgtune.ir.counts.count` reports, else a SystemExit naming them."""
    from rgtune.data.synthetic import random_graph
    from rgtune.ir.counts import count
    from rgtune.ir.models import build_model
    from rgtune.ir.pipeline import compile_program

    g = random_graph((4, 4), num_relations=2, num_edges=16, seed=0)
    valid = sorted(k for k, v in count(compile_program(build_model("rgcn", 4, 4)).kernels, g).items()
                   if isinstance(v, int))
    bad = [n for n in names if n not in valid]
    if bad or not names:
        raise SystemExit(f"--count-features: {bad or 'nothing'} is not a count; choose from {valid}")
    return tuple(names)


def default_backend() -> str:
    from rgtune.codegen.base import available_backends

    return "cpu" if available_backends().get("cpu", (False, ""))[0] else "reference"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    models, real, synthetic = split_names(args.models), split_names(args.real), split_names(args.synthetic)
    estimators, targets = split_names(args.estimators), split_names(args.targets)
    if args.quick:
        models, synthetic = models[:1], synthetic[:1]
        # 16 + 16: the held-out graph's model still sees >= 30 trials of 2 workloads (MIN_TRIALS), so it is on
        args.real_trials, args.synthetic_trials = min(args.real_trials, 16), min(args.synthetic_trials, 16)
        estimators, targets = ["hgb"], ["log_default"]
    backend = args.backend or default_backend()
    set_threads(args.threads)
    use_count_features(args.count_features)
    t0 = time.time()
    if args.collect:
        problem = jobs_problem(args.jobs, backend)
        if problem:
            raise SystemExit(f"costmodel_transfer: {problem}")
        collect(args.db, models, real, synthetic, real_trials=args.real_trials, synthetic_trials=args.synthetic_trials,
                hidden=args.hidden, backend=backend, data_dir=args.data_dir, seed=args.seed,
                repeat_real=args.repeat_real, jobs=args.jobs)
        print(f"collection done in {time.time() - t0:.0f} s")
    if not args.no_eval:
        holdouts = [canonical_dataset(h, args.data_dir) for h in (split_names(args.holdouts) if args.holdouts else real)]
        _, default_model = evaluate(args.db, holdouts, estimators, targets, args.data_dir, Path(args.out), models)
        if args.warm:
            warm_start(args.db, holdouts, models, own=[int(x) for x in split_names(args.warm)],
                       weights=[float(x) for x in split_names(args.warm_weights)], repeats=args.warm_repeats,
                       data_dir=args.data_dir, out=Path(args.out))
        if args.retime_rounds > 0:
            retime_top1(args.db, default_model, rounds=args.retime_rounds, top=args.retime_top,
                        data_dir=args.data_dir, out=Path(args.out))
    print(f"total {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
