"""Tuning curves with and without the learned cost model: the incumbent's re-timed time vs measured trials.

Makes the "Tuning curves, pre-registered" tables of BENCHMARKS.md's "Learned cost model on the CPU" and "on
the GPU" (there through gpu_costmodel.sh). Per (model, dataset, seed) one study per arm, the same budget of
measured trials: `tpe` (TPE alone) and `tpe+rank` (the same sampler and seed with the default RankPolicy).
The model's history is the other graphs' trials (the database of costmodel_transfer.py's history minus the
tuned graph) plus what the study measures; each run has its own copy of it and its own kernel cache, and
ends without `tune`'s confirmation. Every schedule that became a run's incumbent (what the tuner returns)
within --retime-window of the workload's fastest, relative to each run's default schedule, is re-timed in
one process, --retime-rounds shuffled rounds; one outside the window counts at its relative time on the
re-timing's scale. The read-out (readout.md; --readout FOLDER prints a finished run's): the incumbent over
the best (--best) after N trials, and the goal: an arm's median trials to within 5% of the best at most half
of TPE's, and its median seconds fewer (`verdict`). Also written: tuning_curves.csv (the traces),
tuning_curves_retimed.csv, tuning_curves_summary.json.

Examples::

    python experiments/tuning_curves.py --history sqlite:///cm_history_s23.db --budget 100 --seeds 5 \
        --first-seed 70 --retime-rounds 8 --timing paired --out experiments/results/curves
    python experiments/tuning_curves.py --history sqlite:///h.db --models rgat --datasets aifb --seeds 1 --budget 4 \
        --retime-rounds 2 --out /tmp/curves --workdir /tmp/curves_work                          # a smoke run
    python experiments/tuning_curves.py --readout experiments/results/tuning_curves_gpu --after 2,5,10,50,100
    python -c "from rgtune.costmodel.frozen import thaw; from rgtune.db import TrialDatabase as T; \
        thaw('tests/data/costmodel_history.json.gz', T('sqlite:///frozen.db'))"     # the committed history
    python experiments/tuning_curves.py --history sqlite:///frozen.db --models rgcn --datasets synthetic:am \
        --hidden 64 --threads 1 --seeds 3 --budget 30 --arm-budget tpe+rank=10 --retime-rounds 3 \
        --after 5,10,20,30 --out experiments/results/costmodel_am_steer   # 10 trials with the model vs 30 without
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
import sqlite3
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from rgtune._environ import scoped_env
from rgtune.costmodel import CostModel, CostModelGuide, RankPolicy, fit_on_history
from rgtune.db import DeviceInfo, TrialDatabase
from rgtune.db.records import canonical_knobs
from rgtune.tuner import MeasureOptions, TuneOptions, Tuner, Workload
from rgtune.tuner.measure import TIMINGS, median_ok
from rgtune.tuner.study import UNMEASURED

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (canonical_dataset, parser, read_csv, rounds_ms, run_parallel, setup, split_names,  # noqa: E402
                     write_csv)

ARMS = ("tpe", "tpe+rank")
WITHIN = 0.05  # the goal: within 5% of the best
BEST_ESTIMATES = ("crossfit", "min")  # --best, see best_retimed
WorkloadKey = tuple[str, str]  # (model, dataset)
Trace = Sequence[Mapping[str, Any]]  # a run's entries; scored by their ``schedule_hash``


class CurveTuner(Tuner):
    """A :class:`Tuner` that traces every trial (the loop counts the budget and wires the cost model)."""

    def __init__(self, workload: Workload, db: TrialDatabase, options: TuneOptions) -> None:
        super().__init__(workload, db, options)
        self.measured, self.best, self.device_wait_s = 0, math.inf, 0.0  # waits for the GPU's lock (--jobs)
        self.trace: list[dict[str, Any]] = []
        self._t0 = time.perf_counter()  # run() starts right after

    def _evaluate(self, tid: int, config: dict[str, Any], point: Any, number: int, **kw: Any) -> Any:
        result = super()._evaluate(tid, config, point, number, **kw)
        ms = result.median * 1e3 if result.status == "ok" and result.median is not None else None
        if result.status not in UNMEASURED:
            self.measured += 1
            self.best = min(self.best, ms if ms is not None else math.inf)
        self.device_wait_s += result.details.device_wait_s
        self.trace.append({"proposal": len(self.trace) + 1, "measured": self.measured, "status": result.status,
                           "ms": ms, "best_ms": self.best if math.isfinite(self.best) else None,
                           "predicted_ms": result.details.predicted_ms,
                           "measurements": len(result.details.measurements_ms) or int(ms is not None),
                           "wall_s": time.perf_counter() - self._t0 - self.device_wait_s, "knobs": dict(config)})
        return result


# ---------------------------------------------------------------------- history copies, one run
def copy_history(src: TrialDatabase, dst_url: str, exclude_dataset: str) -> TrialDatabase:
    """A new database with ``src``'s finished trials, except those on ``exclude_dataset`` (no Optuna
    tables: a study on the copy starts from nothing, only the cost model sees history)."""
    import sqlalchemy as sa

    from rgtune.db.schema import Device, Graph, Workload as W

    dst = TrialDatabase(dst_url)
    with src.session() as s:
        rows = s.execute(sa.select(W, Graph, Device).join(Graph, W.graph_id == Graph.id)
                         .join(Device, W.device_id == Device.id)).all()
    excluded = {g.content_hash for _, g, _ in rows if g.name == exclude_dataset}
    for w, g, d in rows:
        if g.content_hash in excluded:
            continue
        dev = DeviceInfo(d.name, d.backend, d.architecture, d.runtime, d.compiler, dict(d.extra or {}))
        graph = SimpleNamespace(name=g.name, content_hash=g.content_hash,  # what ensure_graph reads
                                stats=SimpleNamespace(as_dict=lambda stats=dict(g.stats or {}): stats))
        rec = dst.ensure_workload(w.model, graph, dev, in_dim=w.in_dim, out_dim=w.out_dim, heads=w.heads,
                                  backend=w.backend, mode=w.mode, options=w.options, batches=w.batches,
                                  precision=w.precision)
        for t in src.history(w.id):
            if t.status != "running":
                tid = dst.start_trial(rec, t.knobs, predicted_ms=t.predicted_ms)
                dst.finish_trial(tid, t.status, median_ms=t.median_ms, times_ms=t.times_ms, compile_s=t.compile_s,
                                 max_error=t.max_error, error=t.error, source_hash=t.source_hash)
    return dst


def _sqlite_copy(src: Path | None, dst: Path) -> None:
    """Copy an SQLite database (the backup API: a WAL database's last writes may be in ``-wal``); None: remove."""
    for p in (dst, Path(f"{dst}-wal"), Path(f"{dst}-shm")):
        p.unlink(missing_ok=True)
    if src is not None:
        with contextlib.closing(sqlite3.connect(src)) as a, contextlib.closing(sqlite3.connect(dst)) as b:
            a.backup(b)


def prepare_base(history: TrialDatabase, dataset: str, workdir: Path, backend: str, cm: CostModel) -> Path:
    """The leave-``dataset``-out history, with its cost model trained and saved next to it."""
    base = workdir / f"base-{_safe(dataset)}.db"
    if not base.exists():
        tmp = base.with_suffix(".tmp.db")
        _sqlite_copy(None, tmp)
        copy_history(history, f"sqlite:///{tmp}", dataset).close()
        _sqlite_copy(tmp, base)  # whole or not at all: a killed copy is not taken for a base
        _sqlite_copy(None, tmp)
    db = TrialDatabase(f"sqlite:///{base}")
    counts: dict[str, int] = {}
    for w in db.workloads(backend=backend):
        counts[w.device] = counts.get(w.device, 0) + w.num_ok
    if not counts:
        raise SystemExit(f"the history has no {backend} trials: collect one first (BENCHMARKS.md: `tune` studies)")
    fit = fit_on_history(db, cm, backend, max(sorted(counts), key=lambda k: counts[k]))
    print(f"history without {dataset} ({base.name}): {fit.model.status} ({'loaded' if fit.loaded else 'trained'}, "
          f"{len(fit.samples)} trials)", flush=True)
    db.close()
    return base


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


@contextlib.contextmanager
def _own_cache(run_dir: Path) -> Iterator[None]:
    """A kernel cache of ``run_dir``'s own while the block runs (processed graphs linked from the shared
    cache); the measurement worker is spawned, and restarted, with this environment."""
    from rgtune.data._cache import processed_dir

    cache = run_dir / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    for f in processed_dir().glob("*.pt") if processed_dir().is_dir() else ():
        if not (cache / f.name).exists():
            (cache / f.name).symlink_to(f.resolve())
    with scoped_env("RGTUNE_CACHE_DIR", str(cache)):
        yield


def _run_dir(workdir: Path, model: str, dataset: str, seed: int, arm: str) -> Path:
    return workdir / "runs" / f"{model}-{_safe(dataset)}-s{seed}-{_safe(arm)}"


def run_one(model: str, dataset: str, seed: int, arm: str, base: Path, workdir: Path, args: Any,
            backend: str) -> dict[str, Any]:
    """One study, or its trace when it finished before (a work directory holds one timing and recheck)."""
    run_dir = _run_dir(workdir, model, dataset, seed, arm)
    done = run_dir / "trace.json"
    if done.exists():
        finished = json.loads(done.read_text())
        # runs from before --timing were plain; from before the tuner's recheck, measured every trial once
        timed, rechecked = finished.get("timing", "plain"), finished.get("recheck", 1)
        if (timed, rechecked) != (args.timing, args.recheck):
            raise SystemExit(f"tuning_curves: {run_dir} was run with --timing {timed} --recheck {rechecked}, not "
                             f"--timing {args.timing} --recheck {args.recheck}: use another --workdir")
        return finished
    run_dir.mkdir(parents=True, exist_ok=True)
    db_path = run_dir / "results.db"
    _sqlite_copy(base, db_path)
    guide = None
    if arm == "tpe+rank":
        if (saved := Path(f"{base}.costmodel")).is_dir():  # the base history's model
            shutil.copytree(saved, Path(f"{db_path}.costmodel"), dirs_exist_ok=True)
        guide = CostModelGuide(CostModel(), RankPolicy(seed=seed), data_dir=args.data_dir)
    db = TrialDatabase(f"sqlite:///{db_path}")
    opts = TuneOptions(trials=args.arm_budget.get(arm, args.budget), sampler="tpe", seed=seed, progress=False,
                       measure=MeasureOptions(timing=args.timing), guide=guide, recheck=args.recheck, confirm_top=0)
    tuner = CurveTuner(_workload(model, dataset, args, backend), db, opts)
    t0 = time.time()
    with _own_cache(run_dir):
        summary = tuner.run()
    out = {"model": model, "dataset": dataset, "seed": seed, "arm": arm, "budget": opts.trials,
           "timing": args.timing, "recheck": args.recheck,
           "elapsed_s": time.time() - t0 - tuner.device_wait_s, "device_wait_s": tuner.device_wait_s,
           "jobs": args.jobs, "statuses": summary.statuses,
           "cost_model": guide.describe() if guide is not None else None, "trace": tuner.trace}
    text = json.dumps(out, default=str)
    done.write_text(text)
    db.close()
    return json.loads(text)  # what a resumed run reads (JSON types): the two compare alike


def _workload(model: str, dataset: str, args: Any, backend: str) -> Workload:
    """What a run tunes and the re-timing times: --mode, and with --batches a sampler workload."""
    return Workload(model, dataset, args.hidden, args.hidden, 1, backend, args.data_dir, args.mode,
                    batches=args.batches)


# ---------------------------------------------------------------------- re-timing and scoring
def _new_bests(trace: Trace) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """(index, entry) of the trace entries whose measurement lowered the run's best-so-far."""
    best = math.inf
    for i, t in enumerate(trace):
        if t["status"] == "ok" and t["ms"] is not None and t["ms"] < best:
            best = t["ms"]
            yield i, t


def run_default_ms(trace: Trace) -> float | None:
    """The run's time of its default schedule: every study opens with it."""
    return next((t["ms"] for t in trace if t["status"] == "ok" and t["ms"] is not None), None)


def best_relative(traces: Iterable[Trace], relative: bool = True) -> dict[str, float]:
    """Per schedule, its fastest ``ok`` time over ``traces`` relative to its run's default schedule (each
    run is its own measurement process, whose speed cancels in the ratio), or as measured.

    >>> ok = lambda h, ms: {"status": "ok", "ms": ms, "schedule_hash": h}
    >>> best_relative([[ok("d", 10.0), ok("x", 5.0)], [ok("d", 16.0), ok("x", 7.2)]])
    {'d': 1.0, 'x': 0.45}
    """
    out: dict[str, float] = {}
    for trace in traces:
        per = run_default_ms(trace) if relative else 1.0
        for t in trace:
            if t["status"] == "ok" and t["ms"] is not None and per:
                out[t["schedule_hash"]] = min(out.get(t["schedule_hash"], math.inf), t["ms"] / per)
    return out


def incumbents(runs: Sequence[Mapping[str, Any]], window: float) -> dict[WorkloadKey, dict[str, dict[str, Any]]]:
    """Per workload, the schedules to re-time by hash (``knobs``, ``measured_ms``, ``relative``): those
    that became a run's incumbent within ``window`` of the workload's fastest time, relative to each
    run's default schedule."""
    by_workload: dict[WorkloadKey, list[list[dict[str, Any]]]] = {}
    for r in runs:
        by_workload.setdefault((r["model"], r["dataset"]), []).append(
            [{**t, "schedule_hash": canonical_knobs(t["knobs"])[1]} for t in r["trace"]])
    out: dict[WorkloadKey, dict[str, dict[str, Any]]] = {}
    for key, traces in by_workload.items():
        relative, measured = best_relative(traces), best_relative(traces, relative=False)
        chosen: dict[str, dict[str, Any]] = {}
        for trace in traces:
            default = run_default_ms(trace)
            for _, t in _new_bests(trace):
                if default and t["ms"] / default <= (1 + window) * min(relative.values()):
                    h = t["schedule_hash"]
                    chosen[h] = {"knobs": canonical_knobs(t["knobs"])[0], "relative": relative[h],
                                 "measured_ms": measured[h]}
        if chosen:
            out[key] = chosen
    return out


def retime_workload(key: WorkloadKey, schedules: Mapping[str, Mapping[str, Any]], args: Any,
                    backend: str, workdir: Path) -> dict[str, dict[str, Any]]:
    """``schedules`` with each one's ``rounds_ms`` and ``retimed_ms`` (the median of its ok rounds), all
    timed in one measurement process; cached in the work directory while the cache holds them all."""
    model, dataset = key
    path = workdir / "retime" / f"{model}-{_safe(dataset)}.json"
    settings = {"rounds": args.retime_rounds, "hidden": args.hidden, "backend": backend, "timing": args.timing,
                "mode": args.mode, "batches": args.batches}
    cached, t0 = _cached_retimes(path, settings), time.perf_counter()
    if schedules.keys() <= cached.keys():
        out = {h: {**s, **cached[h]} for h, s in schedules.items()}
    else:
        workload = _workload(model, dataset, args, backend)
        with _own_cache(path.parent):
            times = rounds_ms(workload, {h: s["knobs"] for h, s in schedules.items()}, args.retime_rounds,
                              MeasureOptions(timing=args.timing))
        out = {h: {**s, "rounds_ms": times[h], "retimed_ms": median_ok(times[h])} for h, s in schedules.items()}
        path.write_text(json.dumps({"settings": settings, "schedules": {
            h: {k: v[k] for k in ("knobs", "rounds_ms", "retimed_ms")} for h, v in out.items()}}))
    ok = [[t for t in v["rounds_ms"] if t is not None] for v in out.values()]
    spreads = [max(t) / min(t) - 1 for t in ok if len(t) >= 2] or [math.nan]
    print(f"re-timed {model} {dataset}: {len(out)} incumbents in {time.perf_counter() - t0:.0f} s; max/min - 1 "
          f"over a schedule's rounds: median {np.median(spreads):.3f}", flush=True)
    return out


def _cached_retimes(path: Path, settings: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    timed = {"timing": "plain", **data.get("settings", {})}  # caches from before --timing were plain
    return data["schedules"] if timed == dict(settings) else {}


def crossfit_best(rounds: Mapping[str, Sequence[float | None]]) -> float:
    """The best schedule's re-timed time without the winner's curse (the lowest of many noisy medians is
    biased low): the schedule fastest over the even rounds timed over the odd ones and the other way
    round, averaged geometrically. Only schedules with an ``ok`` round in both halves compete.

    >>> crossfit_best({"lucky": [1.0, 1.2, 1.0, 1.2], "steady": [1.1, 1.1, 1.1, 1.1]})  # min of medians: 1.1
    1.1489125293076057
    >>> crossfit_best({"a": [2.0, None]})
    Traceback (most recent call last):
    ...
    ValueError: no re-timed schedule has an ok round in both halves of the rounds (2 rounds or more)
    """
    halves: dict[str, tuple[float, float]] = {}
    for h, times in rounds.items():
        even, odd = [t for t in times[0::2] if t is not None], [t for t in times[1::2] if t is not None]
        if even and odd:
            halves[h] = (float(np.median(even)), float(np.median(odd)))
    if not halves:
        raise ValueError("no re-timed schedule has an ok round in both halves of the rounds (2 rounds or more)")
    by_even, by_odd = min(halves, key=lambda h: halves[h][0]), min(halves, key=lambda h: halves[h][1])
    return math.sqrt(halves[by_even][1] * halves[by_odd][0])


def best_retimed(schedules: Mapping[str, Mapping[str, Any]], how: str) -> float:
    """The best re-timed time of ``schedules`` (each with ``retimed_ms`` and ``rounds_ms``) by ``how``.

    >>> best_retimed({"a": {"retimed_ms": 1.0, "rounds_ms": [0.9, 1.1]}, "b": {"retimed_ms": None}}, "min")
    1.0
    """
    if how == "min":
        return min(v["retimed_ms"] for v in schedules.values() if v.get("retimed_ms") is not None)
    if how == "crossfit":
        return crossfit_best({h: v.get("rounds_ms") or [] for h, v in schedules.items()})
    raise ValueError(f"unknown best estimate {how!r}; choose one of {list(BEST_ESTIMATES)}")


def incumbent_times(trace: Trace, retimed: Mapping[str, float], scale: float = 1.0) -> list[float | None]:
    """At each trace entry, the time of what the run would return then (its lowest measured time so far):
    re-timed when it was, else relative to the run's default times ``scale``."""
    marks, per = dict(_new_bests(trace)), run_default_ms(trace) or 1.0
    out: list[float | None] = []
    quality = None
    for i in range(len(trace)):
        if i in marks:
            h = marks[i]["schedule_hash"]
            quality = retimed[h] if h in retimed else marks[i]["ms"] / per * scale
        out.append(quality)
    return out


def write_outputs(runs: list[dict[str, Any]], detail: Mapping[WorkloadKey, Mapping[str, Mapping[str, Any]]],
                  args: Any) -> None:
    """The traces and the re-timed schedules as CSV, then the summary scored from those files."""
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "tuning_curves.csv", [
        {**{k: r[k] for k in ("model", "dataset", "seed", "arm")},
         **{k: t[k] for k in ("proposal", "measured", "status", "ms", "best_ms", "predicted_ms", "wall_s")},
         "schedule_hash": canonical_knobs(t["knobs"])[1], "measurements": t["measurements"]}
        for r in runs for t in r["trace"]])
    write_csv(args.out / "tuning_curves_retimed.csv", [
        {"model": model, "dataset": dataset, "schedule_hash": h, "knobs": json.dumps(v["knobs"], sort_keys=True),
         **{k: v[k] for k in ("measured_ms", "relative", "retimed_ms")},
         **{f"round{i}_ms": t for i, t in enumerate(v["rounds_ms"])}}
        for (model, dataset), d in sorted(detail.items())
        for h, v in sorted(d.items(), key=lambda kv: (kv[1]["retimed_ms"] is None, kv[1]["retimed_ms"] or 0.0))])
    settings = {k: v for k, v in vars(args).items() if k not in ("history", "workdir", "out", "data_dir", "readout")}
    cost_models = {r["arm"]: r["cost_model"] for r in reversed(runs) if r["cost_model"]}  # each arm's first run
    (args.out / "tuning_curves_summary.json").write_text(json.dumps(
        {"settings": settings, "summary": summarize(args.out, args.best), "cost_model": cost_models}, indent=1,
        default=str))


# ---------------------------------------------------------------------- the read-out (of the files written)
def verdict(base_trials: float, base_seconds: float, arm_trials: float, arm_seconds: float, budget: int) -> str:
    """``met``, ``missed``, ``undecided`` or ``neither``: the goal of one arm against the baseline on one
    workload, from the two medians of trials and of seconds to the goal (inf: not within the budget).
    Where the baseline's is not within the budget, the arm meets it within half the budget, the workload
    is undecided if the arm needs more than half, and neither if the arm does not get there either.

    >>> verdict(28, 18.3, 2, 4.8, 100), verdict(53, 52.1, 30, 30.1, 100)
    ('met', 'missed')
    >>> verdict(math.inf, math.inf, 17, 13.4, 100), verdict(math.inf, math.inf, 67, 79.2, 100)
    ('met', 'undecided')
    """
    if math.isfinite(base_trials):
        return "met" if arm_trials <= base_trials / 2 and arm_seconds < base_seconds else "missed"
    if not math.isfinite(arm_trials):
        return "neither"
    return "met" if arm_trials <= budget / 2 else ("undecided" if arm_trials <= budget else "missed")


def scored_runs(results: Path, how: str) -> Iterator[tuple[tuple[str, str, str], list[dict[str, Any]],
                                                          list[float | None], float]]:
    """Per run of a re-timed workload in ``results``: its (model, dataset, arm), its trace (``ms`` a float or
    None), at each entry the incumbent's time (:func:`incumbent_times`; one not re-timed on the re-timing's
    scale: the best re-timed time over the fastest relative time among the re-timed schedules) and the best
    re-timed time by ``how`` (:func:`best_retimed`)."""
    traces: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for r in read_csv(results / "tuning_curves.csv"):
        traces.setdefault((r["model"], r["dataset"], r["arm"], r["seed"]), []).append(
            {**r, "ms": float(r["ms"]) if r["ms"] else None})
    schedules: dict[WorkloadKey, dict[str, dict[str, Any]]] = {}
    for r in read_csv(results / "tuning_curves_retimed.csv"):  # round columns in order: round0_ms, round1_ms, ...
        rounds = [float(v) if v else None for c, v in r.items() if c.startswith("round") and c[5:-3].isdigit()]
        schedules.setdefault((r["model"], r["dataset"]), {})[r["schedule_hash"]] = {
            "retimed_ms": float(r["retimed_ms"]) if r["retimed_ms"] else None, "rounds_ms": rounds}
    for key, timed in schedules.items():
        if not (retimed := {h: v["retimed_ms"] for h, v in timed.items() if v["retimed_ms"] is not None}):
            continue  # not re-timed: no scale to judge it on
        if how == "crossfit" and not next(iter(timed.values()))["rounds_ms"]:
            raise ValueError(f"best estimate {how!r} needs each re-timing round's time, which "
                             f"tuning_curves_retimed.csv lacks for {' '.join(key)}")
        runs = {k[2:]: trace for k, trace in traces.items() if k[:2] == key}
        relative, best = best_relative(runs.values()), best_retimed(timed, how)
        scale = min(retimed.values()) / min(relative[h] for h in retimed)  # relative time -> re-timed ms
        for (arm, _), trace in runs.items():
            yield (*key, arm), trace, incumbent_times(trace, retimed, scale), best


def summarize(results: Path, how: str) -> list[dict[str, Any]]:
    """One row per re-timed (workload, arm): measured trials and seconds to within 5% of the best per seed
    (inf: not within the budget), their medians, and the runs' median seconds."""
    runs: dict[tuple[str, str, str], list[tuple[float, float, float, float]]] = {}
    for key, trace, values, best in scored_runs(results, how):
        goal = next(((float(t["measured"]), float(t["wall_s"])) for t, v in zip(trace, values)
                     if v is not None and v <= best * (1 + WITHIN)), (math.inf, math.inf))
        runs.setdefault(key, []).append((*goal, float(trace[-1]["wall_s"]), best))
    return [{"model": m, "dataset": d, "arm": arm, "seeds": len(r), "median_wall_s": float(np.median([x[2] for x in r])),
             "retimed_best_known_ms": r[0][3],
             "retimed_median_trials_to_goal": float(np.median([x[0] for x in r])),
             "retimed_median_seconds_to_goal": float(np.median([x[1] for x in r])),
             "retimed_reached": sum(math.isfinite(x[0]) for x in r),
             "retimed_trials_to_goal": [x[0] for x in r], "retimed_seconds_to_goal": [x[1] for x in r]}
            for (m, d, arm), r in sorted(runs.items())]


def quality_after(results: Path, after: Sequence[int], best_estimate: str = "min") -> dict[tuple[str, str, str],
                                                                                         list[float]]:
    """Per (model, dataset, arm): the median over seeds of the incumbent's re-timed time (what the run would
    return then) after each of ``after`` measured trials, over the best re-timed time by ``best_estimate``."""
    per_seed: dict[tuple[str, str, str], list[dict[int, float]]] = {}
    for key, trace, values, best in scored_runs(results, best_estimate):
        per_seed.setdefault(key, []).append({int(t["measured"]): v / best for t, v in zip(trace, values)
                                             if v is not None})
    # past a run's own budget (--arm-budget) there is no incumbent to judge: NaN, shown as a dash
    return {key: [statistics.median(q.get(n, math.inf if n <= max(q, default=0) else math.nan) for q in seeds)
                  for n in after] for key, seeds in per_seed.items()}


def report(results: Path, baseline: str = "tpe", after: Sequence[int] = (2, 5, 10, 20, 30)) -> list[str]:
    """The read-out as lines of Markdown."""
    _trials, _seconds = (lambda x: f"{x:g}" if math.isfinite(x) else "> budget"), \
        (lambda x: f"{x:.1f}" if math.isfinite(x) else "—")
    data = json.loads((results / "tuning_curves_summary.json").read_text())
    rows = {(r["model"], r["dataset"], r["arm"]): r for r in data["summary"] if r["seeds"]}
    budget, best = int(data["settings"]["budget"]), data["settings"].get("best", "min")  # min before --best
    workloads = sorted({(m, d) for m, d, _ in rows})
    present = list(dict.fromkeys(a for _, _, a in rows))
    if baseline not in present:
        raise ValueError(f"arm {baseline!r} not in this run; its arms: {', '.join(present)}")
    arms = [a for a in present if a != baseline]
    scored = "" if best == "min" else f"; best re-timed time: {best}"  # read-outs before --best unchanged
    lines = [f"## Goal against {baseline} (budget {budget}; re-timed medians over seeds{scored})", "",
             "| model | dataset | arm | trials to goal: base / arm | seconds to goal: base / arm | "
             "seeds reaching it: base / arm | trials per seed | verdict |", "|---|---|---|---|---|---|---|---|"]
    tally: dict[str, list[str]] = {}
    for model, dataset in workloads:
        base = rows.get((model, dataset, baseline))
        for arm in arms:
            if base is None or (row := rows.get((model, dataset, arm))) is None:
                continue
            b_t, b_s, a_t, a_s = (r[f"retimed_median_{k}_to_goal"] for r in (base, row) for k in ("trials", "seconds"))
            v = verdict(b_t, b_s, a_t, a_s, budget)
            tally.setdefault(arm, []).append(v)
            lines.append(f"| {model} | {dataset} | {arm} | {_trials(b_t)} / {_trials(a_t)} | {_seconds(b_s)} / "
                         f"{_seconds(a_s)} | {base['retimed_reached']} / {row['retimed_reached']} | "
                         f"{', '.join(_trials(x) for x in sorted(row['retimed_trials_to_goal']))} | {v} |")
    lines += ["", *(f"- {arm}: met on {v.count('met')} of {len(v)}" for arm, v in tally.items())]
    quality = quality_after(results, after, best_estimate=best)
    lines += ["", f"## Re-timed incumbent over the best{'' if best == 'min' else f' ({best})'}, after N measured "
                  "trials", "",
              "| model | dataset | arm | " + " | ".join(f"after {n}" for n in after) + " | seconds per run |",
              "|---|---|---|" + "---|" * (len(after) + 1)]
    for model, dataset in workloads:
        for arm in (baseline, *arms):
            if (q := quality.get((model, dataset, arm))) is not None and (row := rows.get((model, dataset, arm))):
                lines.append(f"| {model} | {dataset} | {arm} | " + " | ".join("—" if math.isnan(x) else f"{x:.2f}"
                                                                                  for x in q)
                             + f" | {row['median_wall_s']:.0f} |")
    return lines


# ---------------------------------------------------------------------- command line
def _arm_budgets(text: str) -> dict[str, int]:
    """``"tpe+rank=10"`` -> ``{"tpe+rank": 10}``; an unknown arm or a count below 1 is an error naming it."""
    out = {}
    for part in filter(None, (x.strip() for x in text.split(","))):
        arm, _, n = part.partition("=")
        if arm not in ARMS or not n.isdigit() or int(n) < 1:
            raise argparse.ArgumentTypeError(f"{part!r}: expected ARM=N with ARM one of {list(ARMS)} and N >= 1")
        out[arm] = int(n)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = parser(__doc__, "models", "datasets", "hidden", "backend", "data-dir", "threads", "jobs", "out")
    p.add_argument("--history", default="sqlite:///cm_history.db", help="the history database (default "
                   "sqlite:///cm_history.db)")
    p.add_argument("--seeds", type=int, default=5, help="seeds per arm (default 5)")
    p.add_argument("--first-seed", type=int, default=0, help="seeds run from this one (default 0)")
    p.add_argument("--budget", type=int, default=100, help="measured trials per run (default 100)")
    p.add_argument("--arms", type=lambda t: t.split(","), default=list(ARMS), help="tpe, tpe+rank or both (default)")
    p.add_argument("--arm-budget", type=_arm_budgets, default={}, metavar="ARM=N[,ARM=N]",
                   help="an arm's own budget of measured trials (e.g. tpe+rank=10: a short study with the model "
                        "against --budget without it; the read-out's time column says what each took)")
    p.add_argument("--best", choices=BEST_ESTIMATES, default="crossfit",
                   help="the best re-timed time: crossfit (default; no winner's curse) or min, the lowest median")
    p.add_argument("--retime-rounds", type=int, default=7, help="rounds of re-timing the incumbents (default 7)")
    p.add_argument("--retime-window", type=float, default=0.25, help="re-time incumbents within this of the "
                   "workload's fastest, relative to each run's default schedule (default 0.25)")
    p.add_argument("--timing", default="plain", choices=TIMINGS, help="tune --timing (default plain)")
    p.add_argument("--mode", default="inference", choices=("inference", "training"), help="tune --mode (default "
                   "inference)")
    p.add_argument("--batches", default=None, metavar="SAMPLER", help="tune --batches: the runs tune (and the "
                   "re-timing times) a sampler workload, e.g. neighbor:fanout=10x10,batch_size=256 (--timing plain)")
    p.add_argument("--recheck", type=int, default=TuneOptions.recheck, help="tune --recheck (default %(default)s)")
    p.add_argument("--workdir", default="cm_curves_work", help="run databases and traces, resumable (default "
                   "cm_curves_work)")
    p.add_argument("--readout", type=Path, default=None, metavar="FOLDER", help="only print FOLDER's read-out")
    p.add_argument("--after", type=lambda t: [int(x) for x in t.split(",")], default=[2, 5, 10, 20, 30, 50, 100],
                   help="measured trials at which the read-out gives the incumbent (default 2,5,10,20,30,50,100)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.readout is not None:
        try:
            print("\n".join(report(args.readout, after=args.after)))
        except (OSError, ValueError) as e:
            print(f"tuning_curves: {e}: give the --out folder of a finished run", file=sys.stderr)
            return 2
        return 0
    if args.retime_rounds < 2 or args.retime_window < 0 or args.recheck < 1 or not set(args.arms) <= set(ARMS):
        p.error(f"--retime-rounds must be >= 2, --retime-window >= 0, --recheck >= 1, --arms of {ARMS}")
    backend, models = setup(p, args), split_names(args.models)
    datasets = [canonical_dataset(d, args.data_dir) for d in split_names(args.datasets)]
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    history = TrialDatabase(args.history)
    tasks = [(model, dataset, seed, arm, base, workdir, args, backend) for dataset in datasets
             for base in [prepare_base(history, dataset, workdir, backend, CostModel())]
             for model in models for seed in range(args.first_seed, args.first_seed + args.seeds) for arm in args.arms]
    t0 = time.time()
    runs = run_parallel(run_one, tasks, args.jobs, on_done=lambda r: print(
        f"{r['model']} {r['dataset']} seed {r['seed']} {r['arm']}: best {(r['trace'] or [{}])[-1].get('best_ms')} ms, "
        f"{r['elapsed_s']:.0f} s [{time.time() - t0:.0f} s total]", flush=True))
    chosen = sorted(incumbents(runs, args.retime_window).items())
    # one process per workload, side by side with --jobs (the GPU's lock keeps their rounds apart)
    timed = run_parallel(retime_workload, [(k, s, args, backend, workdir) for k, s in chosen], args.jobs)
    write_outputs(runs, dict(zip((key for key, _ in chosen), timed)), args)
    lines = report(args.out, after=[n for n in args.after if n <= args.budget])
    (args.out / "readout.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
