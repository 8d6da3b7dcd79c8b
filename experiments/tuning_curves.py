"""Tuning curves with and without the learned cost model: best-so-far vs measured trials and wall time.

For each (model, dataset, seed) up to three studies run through the real tuning loop
(:class:`rgtune.tuner.study.Tuner`, CPU kernels by default), with the same budget of
*measured* trials (``--arms`` picks them):

* ``tpe``: Optuna's TPE alone;
* ``tpe+cm``: the same sampler and seed, with :class:`~rgtune.costmodel.CostModelGuide`
  and its :class:`~rgtune.costmodel.PrunePolicy` as ``TuneOptions.guide``: candidates the
  model predicts clearly worse are not measured;
* ``tpe+rank``: the same, with :class:`~rgtune.costmodel.RankPolicy`: TPE proposes
  ``--pool`` candidates for every measured trial and the one the model ranks first is measured;
  a run opens, after the default schedule, with the model's ``--opening`` first picks of 256
  random schedules (:attr:`RankPolicy.opening`; ``--opening 0``: no opening, as before
  2026-11-24); a fraction ``--local`` of each pool changes 1-2 knobs of one of the fastest
  schedules measured so far (:attr:`RankPolicy.local`; ``--local 0``: none, as in every run
  before the local candidates).

The cost model's history is every other graph's trials (the history database of
``costmodel_transfer.py --collect`` minus the tuned graph: leave-graph-out), plus what the
study measures as it goes (the loop calls its ``observe``). Every run gets its own copy of that
history database (so no run sees another run's trials), the model trained on it, and its own
kernel cache (so no run reuses another's compiled kernels).

Two measures of quality, both against a goal of ``--within`` (5%) of the best known:

* as measured: a run's best-so-far time, against the fastest ``ok`` trial over all runs and
  the history;
* re-timed: a single measurement varies from run to run (on MUTAG the same schedule measured
  in different runs differs by a median 5-6%, as much as the goal), so the minimum over many
  noisy measurements is biased low (the winner's curse) and so is every best-so-far. After all
  runs of a workload, every schedule that became some run's best-so-far, measured within
  ``--retime-window`` (25%) of the workload's fastest time, both relative to the default
  schedule's time in the same run (a slower one cannot plausibly be within 5% of the best; every
  run is its own measurement process, and between processes the same schedule's absolute time
  moved by up to 1.7x), is timed again: all in one measurement process, ``--retime-rounds``
  rounds, each in a new shuffled order (drift in the machine's state does not favour the
  schedules measured first); its time is the median of its ``ok`` rounds. At each point of a
  run its incumbent is the schedule with the lowest measured time so far (what the tuner would
  return); its quality is its re-timed time (if it was not re-timed, its time relative to its
  run's default schedule, put on the re-timing's scale), against the best re-timed time. The
  lowest re-timed median is itself a minimum over noisy medians, biased low (on the committed runs
  the crossfit best below sat a median 3.5% above it, 0-14% per workload); so by default
  (``--best crossfit``, the third correction) the best is the schedule fastest over half of the
  rounds, timed over the other half, both ways (:func:`crossfit_best`); ``--best min`` scores as
  every run before it did. Re-timings are cached in the work directory.

``--timing paired`` times every trial and every re-timing round paired with the default schedule
(``tune --timing paired``; see :mod:`rgtune.tuner.measure`), which cancels the machine's drift;
a work directory holds runs of one timing only.

``--jobs N`` (GPU backends only) runs N runs side by side, and re-times N workloads side by side:
a trial on the GPU spends most of its time on the host (compiling, the float64 reference, the
sampler and the model), and the measurement workers' lock on the device keeps any two from
verifying or timing at once (:mod:`rgtune.tuner.device_lock`). A trace's ``wall_s`` leaves out
the time the run waited for that lock (``device_wait_s``, cumulative); the runs still share the
host's cores (``cores // N`` threads each).

``--recheck N`` is the tuner's (``tune --recheck``, default 3): a trial whose measurement beats
the run's best so far is measured N times in all and its time is the median. So a trace's
times are the tuner's, and a run's incumbent is what the tuner holds for its best; the extra
measurements count in the run's seconds, not in its trials (``measurements`` in a trace entry).
A work directory holds runs of one recheck setting per arm: to compare settings in one run (all
incumbents re-timed in one process), give an arm twice, once as ``ARM/recheck=N`` (e.g.
``--arms tpe,tpe/recheck=1,tpe+rank,tpe+rank/recheck=1``).

Outputs (``--out``, default ``experiments/results``): ``tuning_curves.csv`` (every trial of
every run), ``tuning_curves_summary.csv`` and ``.json`` (trials and seconds to the goal,
medians over seeds; as measured, and re-timed in the ``retimed_*`` columns),
``tuning_curves_retimed.csv`` (every re-timed schedule with each round's time),
``tuning_curves.png`` (the re-timed curves when re-timing ran, else the as-measured ones).

Examples::

    python experiments/tuning_curves.py --help
    python experiments/tuning_curves.py --history sqlite:///cm_history.db              # the full run
    python experiments/tuning_curves.py --history sqlite:///cm_history.db --quick      # a smoke run
    python experiments/tuning_curves.py --history sqlite:///cm_history.db --arms tpe,tpe+rank
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import sqlite3
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from rgtune._environ import scoped_env
from rgtune.db.records import canonical_knobs
from rgtune.costmodel import CostModel, CostModelGuide, PrunePolicy, RankPolicy, fit_on_history
from rgtune.db import DeviceInfo, TrialDatabase
from rgtune.tuner.measure import TIMINGS, MeasureOptions, MeasureResult, Workload, measure_rounds, median_ok
from rgtune.tuner.study import UNMEASURED, TuneOptions, Tuner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _parallel import jobs_problem, run_parallel  # noqa: E402 - experiments/ is not a package

RESULTS = Path(__file__).resolve().parent / "results"
#: ablation and variant arms: the rank policy with one part switched off or changed, whatever the
#: command line sets it to
RANK_ABLATIONS: dict[str, dict[str, Any]] = {
    "tpe+rank0": {"opening": 0},  # no opening
    "tpe+rank-local0": {"local": 0.0},  # no local candidates: every pool comes from TPE
    # the opening rules (RankPolicy.opening_rule): lcb, the default since 2026-11-25, and top, the one before
    "tpe+rank-lcb": {"opening_rule": "lcb"},
    "tpe+rank-top": {"opening_rule": "top"},
    "tpe+rank-tiles": {},  # the default policy; its model has more count features (FEATURE_VARIANTS)
}
#: arms whose cost model uses these IR counts as features besides the default ones
#: (``_costmodel_features.COUNT_KEYS``): each gets a base model of its own, trained with them
FEATURE_VARIANTS: dict[str, tuple[str, ...]] = {
    "tpe+rank-tiles": ("gemm_tiles", "gemm_rows_computed", "gemm_tile_weight_bytes"),
}
ARMS = ("tpe", "tpe+cm", "tpe+rank", *RANK_ABLATIONS)
#: what a run compares unless --arms says otherwise; the ablation arms are for ablations
DEFAULT_ARMS = ("tpe", "tpe+cm", "tpe+rank")
COLORS = {"tpe": "tab:blue", "tpe+cm": "tab:red", "tpe+rank": "tab:green", "tpe+rank0": "tab:olive",
          "tpe+rank-local0": "tab:purple", "tpe+rank-lcb": "tab:brown", "tpe+rank-top": "tab:gray",
          "tpe+rank-tiles": "tab:cyan"}
WorkloadKey = tuple[str, str]  # (model, dataset)
#: how the best re-timed time of a workload is estimated (``--best``; see :func:`best_retimed`)
BEST_ESTIMATES = ("crossfit", "min")
#: an arm of ARMS with this and N appended runs with the tuner's recheck N, whatever --recheck says
RECHECK_VARIANT = "/recheck="


# ---------------------------------------------------------------------- the loop, instrumented
class CurveTuner(Tuner):
    """A :class:`Tuner` that traces every trial (the loop itself counts the measured-trial budget
    and does the cost model's wiring: ``bind``, ``observe`` after each measured trial, ``close``)."""

    def __init__(self, workload: Workload, db: TrialDatabase, options: TuneOptions) -> None:
        super().__init__(workload, db, options)
        self.measured, self.best = 0, math.inf
        self.trace: list[dict[str, Any]] = []
        self.setup_s = 0.0
        self.device_wait_s = 0.0  # waited for the GPU's lock (runs side by side: --jobs)

    def run(self) -> Any:
        self._t0 = time.perf_counter()
        return super().run()

    def _setup(self) -> None:
        super()._setup()
        self.setup_s = time.perf_counter() - self._t0

    def _evaluate(self, config: dict[str, Any], point: Any, number: int, **kw: Any) -> MeasureResult:
        result = super()._evaluate(config, point, number, **kw)  # kw: the ranking path's pick (ranked, predicted)
        ms = result.median * 1e3 if result.status == "ok" and result.median is not None else None
        if result.status not in UNMEASURED:
            self.measured += 1
            if ms is not None:
                self.best = min(self.best, ms)
        self.device_wait_s += result.info.get("device_wait_s", 0.0)
        # the knobs let a schedule be timed again after the runs (see retime_workload)
        self.trace.append({"proposal": len(self.trace) + 1, "measured": self.measured, "status": result.status,
                           "ms": ms, "best_ms": self.best if math.isfinite(self.best) else None,
                           "predicted_ms": result.info.get("predicted_ms"),
                           "measurements": len(result.info.get("measurements_ms", [])) or int(ms is not None),
                           "wall_s": time.perf_counter() - self._t0 - self.device_wait_s,
                           "device_wait_s": self.device_wait_s, "knobs": dict(config)})
        return result


# ---------------------------------------------------------------------- history copies
def copy_history(src: TrialDatabase, dst_url: str, exclude_dataset: str) -> TrialDatabase:
    """A new database with ``src``'s finished trials, except those on ``exclude_dataset``.

    Written through :class:`TrialDatabase` (devices, graphs and knobs as recorded), and without
    Optuna's tables: a study on the copy starts from nothing, only the cost model sees history.
    """
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
        graph = _GraphRow(g.name, g.content_hash, dict(g.stats or {}))
        rec = dst.ensure_workload(w.model, graph, dev, in_dim=w.in_dim, out_dim=w.out_dim, heads=w.heads,
                                  backend=w.backend, mode=w.mode)
        for t in src.history(w.id):
            if t.status == "running":
                continue
            tid = dst.start_trial(rec, t.knobs, predicted_ms=t.predicted_ms)
            dst.finish_trial(tid, t.status, median_ms=t.median_ms, times_ms=t.times_ms, compile_s=t.compile_s,
                             max_error=t.max_error, error=t.error, source_hash=t.source_hash)
    return dst


class _GraphRow:
    """A graph as the database recorded it (what ``ensure_graph`` reads)."""

    def __init__(self, name: str, content_hash: str, stats: dict[str, Any]) -> None:
        self.name, self.content_hash, self._stats = name, content_hash, stats

    @property
    def stats(self) -> "_GraphRow":
        return self

    def as_dict(self) -> dict[str, Any]:
        return self._stats


def _sqlite_copy(src: Path, dst: Path) -> None:
    """Copy an SQLite database (the backup API: a WAL database's last writes may be in ``-wal``)."""
    a, b = sqlite3.connect(src), sqlite3.connect(dst)
    with b:
        a.backup(b)
    a.close()
    b.close()


def _main_device(db: TrialDatabase, backend: str) -> str:
    counts: dict[str, int] = {}
    for w in db.workloads(backend=backend):
        counts[w.device] = counts.get(w.device, 0) + w.num_ok
    if not counts:
        raise SystemExit(f"the history has no {backend} trials: run costmodel_transfer.py --collect first")
    return max(sorted(counts), key=lambda k: counts[k])


def prepare_base(history: TrialDatabase, dataset: str, workdir: Path, backend: str, cm: CostModel,
                 extra_counts: tuple[str, ...] = ()) -> Path:
    """The leave-``dataset``-out history, with its cost model trained and saved next to it (with
    ``extra_counts`` as features too: a copy of its own, whose saved model has those features)."""
    if extra_counts:
        plain = prepare_base(history, dataset, workdir, backend, cm)
        base = workdir / f"base-{_safe(dataset)}-{'-'.join(extra_counts)}.db"
        if not base.exists():
            _sqlite_copy(plain, base)
        with count_features(extra_counts):
            _fit_base(base, dataset, backend, cm)
        return base
    base = workdir / f"base-{_safe(dataset)}.db"
    if not base.exists():
        tmp = base.with_suffix(".tmp.db")
        for p in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
            p.unlink(missing_ok=True)
        db = copy_history(history, f"sqlite:///{tmp}", dataset)
        db.close()
        _sqlite_copy(tmp, base)
        for p in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
            p.unlink(missing_ok=True)
    _fit_base(base, dataset, backend, cm)
    return base


def _fit_base(base: Path, dataset: str, backend: str, cm: CostModel) -> None:
    db = TrialDatabase(f"sqlite:///{base}")
    fit = fit_on_history(db, cm, backend, _main_device(db, backend))
    print(f"history without {dataset} ({base.name}): {fit.model.status} ({'loaded' if fit.loaded else 'trained'}, "
          f"{len(fit.samples)} trials)", flush=True)
    db.close()


@contextlib.contextmanager
def count_features(extra: Sequence[str]) -> Iterator[None]:
    """The cost model's count features are the default ones plus ``extra`` while the block runs (the
    feature code reads ``COUNT_KEYS`` on every row)."""
    from rgtune.tuner import _costmodel_features

    default = _costmodel_features.COUNT_KEYS
    _costmodel_features.COUNT_KEYS = (*default, *(k for k in extra if k not in default))
    try:
        yield
    finally:
        _costmodel_features.COUNT_KEYS = default


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


@contextlib.contextmanager
def _own_cache(run_dir: Path) -> Iterator[None]:
    """A kernel cache of ``run_dir``'s own while the block runs (processed graphs are linked from the
    shared cache); the measurement worker is spawned, and restarted, with this environment."""
    from rgtune.data._cache import processed_dir

    shared = processed_dir()
    cache = run_dir / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    if shared.is_dir():
        for f in shared.glob("*.pt"):
            link = cache / f.name
            if not link.exists():
                link.symlink_to(f.resolve())
    with scoped_env("RGTUNE_CACHE_DIR", str(cache)):
        yield


def _run_dir(workdir: Path, model: str, dataset: str, seed: int, arm: str) -> Path:
    return workdir / "runs" / f"{model}-{_safe(dataset)}-s{seed}-{_safe(arm)}"


def arm_parts(arm: str) -> tuple[str, int | None]:
    """An arm's base arm (of :data:`ARMS`) and the recheck it sets (None: ``--recheck``'s). So
    ``tpe+rank`` and ``tpe+rank/recheck=1`` can run side by side, re-timed in one process.

    Example:
        >>> arm_parts("tpe+rank/recheck=1"), arm_parts("tpe")
        (('tpe+rank', 1), ('tpe', None))
    """
    base, variant, n = arm.partition(RECHECK_VARIANT)
    if not variant:
        return arm, None
    if not n.isdigit() or int(n) < 1:
        raise ValueError(f"arm {arm!r}: the recheck after {RECHECK_VARIANT!r} must be an integer >= 1")
    return base, int(n)


def _recheck(arm: str, args: argparse.Namespace) -> int:
    recheck = arm_parts(arm)[1]
    return args.recheck if recheck is None else recheck


def _policy(arm: str, args: argparse.Namespace, seed: int) -> PrunePolicy | RankPolicy | None:
    """The cost model's policy of an arm (None: TPE alone); raises ValueError on bad settings."""
    arm = arm_parts(arm)[0]
    if arm == "tpe+cm":
        return PrunePolicy(margin=args.margin, explore=args.explore, warmup=args.warmup, seed=seed)
    if arm == "tpe+rank" or arm in RANK_ABLATIONS:
        settings = {"opening": args.opening, "local": args.local, **RANK_ABLATIONS.get(arm, {})}
        return RankPolicy(pool=args.pool, explore=args.explore, seed=seed, **settings)
    return None


def _pruner(arm: str, args: argparse.Namespace, seed: int) -> CostModelGuide | None:
    policy = _policy(arm, args, seed)
    return None if policy is None else CostModelGuide(CostModel(), policy, data_dir=args.data_dir)


# ---------------------------------------------------------------------- one run
def run_one(model: str, dataset: str, seed: int, arm: str, base: Path, workdir: Path, args: argparse.Namespace,
            backend: str) -> dict[str, Any]:
    run_dir = _run_dir(workdir, model, dataset, seed, arm)
    done = run_dir / "trace.json"
    if done.exists():
        finished = json.loads(done.read_text())
        timed = finished.get("timing", "plain")  # runs from before --timing were plain
        rechecked = finished.get("recheck", 1)  # runs from before the tuner's recheck measured every trial once
        if (timed, rechecked) != (args.timing, _recheck(arm, args)):
            raise SystemExit(f"tuning_curves: {run_dir} was run with --timing {timed} --recheck {rechecked}, not "
                             f"--timing {args.timing} --recheck {_recheck(arm, args)}: use another --workdir")
        return finished
    run_dir.mkdir(parents=True, exist_ok=True)
    db_path = run_dir / "results.db"
    for p in (db_path, Path(f"{db_path}-wal"), Path(f"{db_path}-shm")):
        p.unlink(missing_ok=True)
    _sqlite_copy(base, db_path)
    saved = Path(f"{base}.costmodel")
    if _policy(arm, args, seed) is not None and saved.is_dir():  # the model trained on the base history
        target = Path(f"{db_path}.costmodel")
        target.mkdir(exist_ok=True)
        for f in saved.iterdir():
            (target / f.name).write_bytes(f.read_bytes())
    pruner = _pruner(arm, args, seed)
    db = TrialDatabase(f"sqlite:///{db_path}")
    opts = TuneOptions(trials=args.budget, sampler="tpe", seed=seed, progress=False,
                       measure=_measure_options(args), guide=pruner,
                       max_proposals_per_trial=args.max_proposal_factor, recheck=_recheck(arm, args),
                       confirm_top=0)  # the search alone: the incumbents are re-timed after all runs
    tuner = CurveTuner(Workload(model, dataset, args.hidden, args.hidden, 1, backend, args.data_dir), db, opts)
    t0 = time.time()
    with _own_cache(run_dir), count_features(FEATURE_VARIANTS.get(arm_parts(arm)[0], ())):
        summary = tuner.run()
    out = {"model": model, "dataset": dataset, "seed": seed, "arm": arm, "budget": args.budget,
           "timing": args.timing, "recheck": _recheck(arm, args), "setup_s": tuner.setup_s,
           "elapsed_s": time.time() - t0 - tuner.device_wait_s, "device_wait_s": tuner.device_wait_s,
           "jobs": args.jobs, "statuses": summary.statuses,
           "cost_model": pruner.describe() if pruner is not None else None, "trace": tuner.trace}
    text = json.dumps(out, default=str)
    done.write_text(text)
    db.close()
    return json.loads(text)  # what a resumed run reads (JSON types): the two compare alike


def _measure_options(args: argparse.Namespace) -> MeasureOptions:
    """How every trial and every re-timing round of the experiment is measured."""
    return MeasureOptions(timeout=args.trial_timeout, timing=args.timing)


def backfill_knobs(run: dict[str, Any], workdir: Path) -> None:
    """Knobs for a trace written before traces had them: the run's database holds one trial per
    trace entry, in order (its base history leaves the tuned graph out). Left alone unless every
    trial matches its entry's status and time."""
    if all("knobs" in t for t in run["trace"]):
        return
    path = _run_dir(workdir, run["model"], run["dataset"], run["seed"], run["arm"]) / "results.db"
    if not path.exists():
        return
    db = TrialDatabase(f"sqlite:///{path}")
    try:
        trials = db.history(model=run["model"], dataset=run["dataset"])
    finally:
        db.close()
    if len(trials) != len(run["trace"]) or not all(_same_trial(t, e) for t, e in zip(trials, run["trace"])):
        return
    for t, e in zip(trials, run["trace"]):
        e["knobs"] = dict(t.knobs)


def _same_trial(trial: Any, entry: dict[str, Any]) -> bool:
    if trial.status != entry["status"]:
        return False
    if entry["ms"] is None or trial.median_ms is None:
        return entry["ms"] is None and trial.median_ms is None
    return math.isclose(trial.median_ms, entry["ms"], rel_tol=1e-9)


# ---------------------------------------------------------------------- re-timing
def _key(run: Mapping[str, Any]) -> WorkloadKey:
    return run["model"], run["dataset"]


def _schedule(entry: Mapping[str, Any]) -> str | None:
    """The schedule hash of a trace entry (None for an entry without knobs)."""
    knobs = entry.get("knobs")
    return canonical_knobs(knobs)[1] if knobs is not None else None


def _new_bests(trace: Sequence[Mapping[str, Any]]) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """(index, entry) of the trace entries whose measurement lowered the run's best-so-far."""
    best = math.inf
    for i, t in enumerate(trace):
        if t["status"] == "ok" and t["ms"] is not None and t["ms"] < best:
            best = t["ms"]
            yield i, t


def run_default_ms(trace: Sequence[Mapping[str, Any]]) -> float | None:
    """The run's time of the default schedule: its first ``ok`` trial (every study opens with it)."""
    return next((t["ms"] for t in trace if t["status"] == "ok" and t["ms"] is not None), None)


def best_relative(traces: Iterable[Sequence[Mapping[str, Any]]],
                  schedule: Callable[[Mapping[str, Any]], str | None] = _schedule) -> dict[str, float]:
    """Per schedule of one workload's ``traces``, its fastest time relative to the default schedule's
    time in the same run.

    Runs are separate measurement processes, and a process's times share its speed: a paired
    process scales every ratio by the default's time as it calibrated it when it started, a plain
    one by how fast the machine ran then. Within a run those factors cancel in the ratio; between runs
    the absolute times of one schedule differed by up to 1.7x (RGAT AIFB, 2026-11-25), so an absolute
    time does not say how close a schedule measured in one run is to the best of another.

    >>> best_relative([[{"status": "ok", "ms": 10.0, "h": "d"}, {"status": "ok", "ms": 5.0, "h": "x"}],
    ...                [{"status": "ok", "ms": 16.0, "h": "d"}, {"status": "ok", "ms": 7.2, "h": "x"}]],
    ...               schedule=lambda t: t["h"])
    {'d': 1.0, 'x': 0.45}
    """
    return _fastest(traces, schedule, relative=True)


def _fastest(traces: Iterable[Sequence[Mapping[str, Any]]], schedule: Callable[[Mapping[str, Any]], str | None],
             relative: bool) -> dict[str, float]:
    """Per schedule, its fastest ``ok`` time over ``traces``: as measured, or over its run's default."""
    out: dict[str, float] = {}
    for trace in traces:
        per = run_default_ms(trace) if relative else 1.0
        for t in trace:
            h = schedule(t) if t["status"] == "ok" and t["ms"] is not None else None
            if h is not None and per:
                out[h] = min(out.get(h, math.inf), t["ms"] / per)
    return out


def incumbents(runs: Sequence[Mapping[str, Any]], window: float) -> dict[WorkloadKey, dict[str, dict[str, Any]]]:
    """Per workload, the schedules worth re-timing, by hash (``knobs``; ``measured_ms``: the fastest
    measured in the runs; ``relative``: :func:`best_relative`): those that became some run's
    best-so-far at a time, relative to that run's default schedule, within ``window`` of the
    workload's fastest relative time (a slower one cannot plausibly be within the goal of the best).

    Until the second correction of 2026-11-25 the window held absolute measured times; a run
    measured in a slow process then had its incumbents left out, however close they were to the best."""
    by_workload: dict[WorkloadKey, list[Mapping[str, Any]]] = {}
    for r in runs:
        by_workload.setdefault(_key(r), []).append(r)
    out: dict[WorkloadKey, dict[str, dict[str, Any]]] = {}
    for key, sel in by_workload.items():
        relative = best_relative(r["trace"] for r in sel)
        if not relative:
            continue
        fastest = min(relative.values())
        chosen: dict[str, dict[str, Any]] = {}
        for r in sel:
            default = run_default_ms(r["trace"])
            for _, t in _new_bests(r["trace"]):
                h = _schedule(t)
                if h is not None and default and t["ms"] / default <= (1 + window) * fastest:
                    chosen[h] = {"knobs": canonical_knobs(t["knobs"])[0], "relative": relative[h]}
        # its best measurement may come from a run where it never was the incumbent
        measured = _fastest((r["trace"] for r in sel), _schedule, relative=False)
        for h, v in chosen.items():
            v["measured_ms"] = measured[h]
        if chosen:
            out[key] = chosen
    return out


def retime_all(runs: Sequence[Mapping[str, Any]], args: argparse.Namespace, backend: str,
               workdir: Path) -> dict[WorkloadKey, dict[str, dict[str, Any]]]:
    if args.retime_rounds <= 0:
        return {}
    chosen = sorted(incumbents(runs, args.retime_window).items())
    # one process per workload, side by side with --jobs (the GPU's lock keeps their rounds apart)
    timed = run_parallel(retime_workload, [(key, schedules, args, backend, workdir) for key, schedules in chosen],
                         args.jobs)
    return {key: out for (key, _), out in zip(chosen, timed)}


def retime_workload(key: WorkloadKey, schedules: Mapping[str, Mapping[str, Any]], args: argparse.Namespace,
                    backend: str, workdir: Path) -> dict[str, dict[str, Any]]:
    """``schedules`` with each one's ``rounds_ms`` and ``retimed_ms`` (the median of its ok rounds).

    All in one measurement process, so that the times compare with each other. Cached in the work
    directory; the cache serves while it holds every schedule asked for, timed with these settings.
    """
    model, dataset = key
    path = workdir / "retime" / f"{model}-{_safe(dataset)}.json"
    settings = {"rounds": args.retime_rounds, "hidden": args.hidden, "backend": backend, "timing": args.timing}
    cached = _cached_retimes(path, settings)
    if schedules.keys() <= cached.keys():
        out = {h: {**s, **cached[h]} for h, s in schedules.items()}
        print(_retime_line(key, out, f"cached in {path}"), flush=True)
        return out
    t0 = time.perf_counter()
    workload = Workload(model, dataset, args.hidden, args.hidden, 1, backend, args.data_dir)
    rounds = _measure_rounds({h: s["knobs"] for h, s in schedules.items()}, workload, args, path.parent)
    out = {h: {**s, "rounds_ms": rounds[h], "retimed_ms": median_ok(rounds[h])} for h, s in schedules.items()}
    path.write_text(json.dumps({"settings": settings, "schedules": {
        h: {k: v[k] for k in ("knobs", "rounds_ms", "retimed_ms")} for h, v in out.items()}}))
    print(_retime_line(key, out, f"{time.perf_counter() - t0:.0f} s"), flush=True)
    return out


def _cached_retimes(path: Path, settings: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    timed = {"timing": "plain", **data.get("settings", {})}  # caches from before --timing were plain
    return data["schedules"] if timed == dict(settings) else {}


def _measure_rounds(knobs: Mapping[str, Mapping[str, Any]], workload: Workload, args: argparse.Namespace,
                    retime_dir: Path) -> dict[str, list[float | None]]:
    """Each schedule's time (ms; None unless ok) in each round (see :func:`measure_rounds`)."""
    with _own_cache(retime_dir):
        seconds = measure_rounds(workload, knobs, args.retime_rounds, _measure_options(args))
    return {h: [None if t is None else t * 1e3 for t in v] for h, v in seconds.items()}


def _retime_line(key: WorkloadKey, out: Mapping[str, Mapping[str, Any]], how: str) -> str:
    ok = [[t for t in v["rounds_ms"] if t is not None] for v in out.values()]
    spreads = [max(t) / min(t) - 1 for t in ok if len(t) >= 2]
    spread = f"{np.median(spreads):.3f}" if spreads else "n/a"
    return (f"re-timed {key[0]} {key[1]}: {len(out)} incumbents, {sum(bool(t) for t in ok)} with an ok round, "
            f"{max((len(v['rounds_ms']) for v in out.values()), default=0)} rounds ({how}); max/min - 1 over a "
            f"schedule's rounds: median {spread}")


def _scales(detail: Mapping[WorkloadKey, Mapping[str, Mapping[str, Any]]]) -> dict[WorkloadKey, float]:
    """Per re-timed workload, :func:`retimed_scale` of its re-timed schedules' relative times."""
    pairs = {key: [(v["relative"], v["retimed_ms"]) for v in d.values() if v["retimed_ms"] is not None]
             for key, d in detail.items()}
    return {key: retimed_scale(p) for key, p in pairs.items() if p}


def _retimed_times(detail: Mapping[WorkloadKey, Mapping[str, Mapping[str, Any]]]
                   ) -> dict[WorkloadKey, dict[str, float]]:
    """Per workload, the re-timed ms of each schedule that has one (workloads without any left out)."""
    out = {key: {h: v["retimed_ms"] for h, v in d.items() if v["retimed_ms"] is not None}
           for key, d in detail.items()}
    return {key: d for key, d in out.items() if d}


def _retimed_bests(detail: Mapping[WorkloadKey, Mapping[str, Mapping[str, Any]]], how: str
                   ) -> dict[WorkloadKey, float]:
    """Per workload with a re-timed schedule, its best re-timed time (:func:`best_retimed`)."""
    return {key: best_retimed(detail[key], how) for key in _retimed_times(detail)}


def retimed_scale(schedules: Iterable[tuple[float, float]]) -> float:
    """The factor that puts a run's time of a schedule on the re-timing's scale: over the re-timed
    schedules (``(time, retimed_ms)`` pairs), the best re-timed time over the fastest time. The
    times are :func:`best_relative` ones (before the second correction of 2026-11-25, absolute
    measured ones).

    An incumbent outside ``--retime-window`` is not re-timed. Its run may have measured while the
    machine ran faster than during the re-timing; scaled by this factor it stays that far from the
    best on the re-timed scale too (unscaled, on a machine that ran 1.7x slower while re-timing,
    such incumbents counted as within the goal, below the best).

    >>> retimed_scale([(8.0, 14.0), (10.0, 15.0)])
    1.75
    """
    pairs = list(schedules)
    return min(r for _, r in pairs) / min(m for m, _ in pairs)


def crossfit_best(rounds: Mapping[str, Sequence[float | None]]) -> float:
    """The re-timed time of a workload's best schedule without the winner's curse (the third correction).

    Every re-timed median is noisy, so the lowest of them is biased low: over the 56 workload
    re-timings committed before this estimate, the schedule fastest over half of the re-timing
    rounds was a median 4.7% slower over the other half (0-18% per workload), most of the goal's 5%. Here the rounds are split in
    two halves (even and odd rounds); the schedule fastest by its median over one half is timed by
    its median over the other, and the two such estimates are averaged (geometrically). Each
    estimate times a schedule on rounds it was not chosen on, so it is an honest time of a schedule
    that the re-timing found best; only schedules with an ``ok`` round in both halves compete.

    >>> crossfit_best({"lucky": [1.0, 1.2, 1.0, 1.2], "steady": [1.1, 1.1, 1.1, 1.1]})  # min of medians: 1.1
    1.1489125293076057
    >>> crossfit_best({"a": [2.0, None]})
    Traceback (most recent call last):
    ...
    ValueError: no re-timed schedule has an ok round in both halves of the rounds (2 rounds or more)
    """
    halves: dict[str, tuple[float, float]] = {}
    for h, times in rounds.items():
        even = [t for t in times[0::2] if t is not None]
        odd = [t for t in times[1::2] if t is not None]
        if even and odd:
            halves[h] = (float(np.median(even)), float(np.median(odd)))
    if not halves:
        raise ValueError("no re-timed schedule has an ok round in both halves of the rounds (2 rounds or more)")
    by_even = min(halves, key=lambda h: halves[h][0])
    by_odd = min(halves, key=lambda h: halves[h][1])
    return math.sqrt(halves[by_even][1] * halves[by_odd][0])


def best_retimed(schedules: Mapping[str, Mapping[str, Any]], how: str) -> float:
    """A workload's best re-timed time from its re-timed ``schedules`` (each with ``retimed_ms`` and
    ``rounds_ms``): ``min``, the lowest re-timed median (every read-out before the third correction),
    or ``crossfit`` (:func:`crossfit_best`).

    >>> best_retimed({"a": {"retimed_ms": 1.0, "rounds_ms": [0.9, 1.1]}, "b": {"retimed_ms": None}}, "min")
    1.0
    """
    if how == "min":
        return min(v["retimed_ms"] for v in schedules.values() if v.get("retimed_ms") is not None)
    if how == "crossfit":
        return crossfit_best({h: v.get("rounds_ms") or [] for h, v in schedules.items()})
    raise ValueError(f"unknown best estimate {how!r}; choose one of {list(BEST_ESTIMATES)}")


def incumbent_times(trace: Sequence[Mapping[str, Any]], retimed: Mapping[str, float],
                    schedule: Callable[[Mapping[str, Any]], str | None] = _schedule,
                    scale: float = 1.0, relative: bool = True) -> list[float | None]:
    """At each trace entry, the time of what the run would return then (the schedule with the lowest
    measured time so far): re-timed when it was, else its time relative to the run's default schedule
    (``relative=False``: its measured time, as scored before that correction) times ``scale`` (see
    :func:`retimed_scale`); None before the first ok trial. ``schedule`` gives an entry's schedule
    hash (``curves_readout.py`` reads the hashes the CSV holds)."""
    marks = dict(_new_bests(trace))
    per = (run_default_ms(trace) or 1.0) if relative else 1.0  # a trace with a new best has an ok trial
    out: list[float | None] = []
    quality = None
    for i in range(len(trace)):
        if i in marks:
            h = schedule(marks[i])
            quality = retimed[h] if h in retimed else marks[i]["ms"] / per * scale
        out.append(quality)
    return out


# ---------------------------------------------------------------------- summary and plot
def best_known(runs: list[dict[str, Any]], history: TrialDatabase, hidden: int, backend: str) -> dict[tuple, float]:
    best: dict[tuple[str, str], float] = {}
    for r in runs:
        for t in r["trace"]:
            if t["ms"] is not None:
                key = (r["model"], r["dataset"])
                best[key] = min(best.get(key, math.inf), t["ms"])
    for (model, dataset) in list(best):
        for w in history.workloads(model=model, dataset=dataset, in_dim=hidden, backend=backend):
            if w.best_ms is not None:
                best[(model, dataset)] = min(best[(model, dataset)], w.best_ms)
    return best


def repeat_noise(workdir: Path, runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """How reproducible a time is here: schedules measured in several runs (the default schedule
    opens every run), per workload, the median of max/min - 1 over those schedules."""
    times: dict[tuple[str, str], dict[str, list[float]]] = {}
    for r in runs:
        path = _run_dir(workdir, r["model"], r["dataset"], r["seed"], r["arm"])
        db = TrialDatabase(f"sqlite:///{path / 'results.db'}")
        per = times.setdefault((r["model"], r["dataset"]), {})
        for t in db.history(model=r["model"], dataset=r["dataset"], status="ok"):
            per.setdefault(t.schedule_hash, []).append(float(t.median_ms))  # type: ignore[arg-type]
        db.close()
    out = {}
    for (model, dataset), per in sorted(times.items()):
        spreads = [max(v) / min(v) - 1 for v in per.values() if len(v) >= 2]
        out[f"{model} {dataset}"] = {"repeated_schedules": len(spreads),
                                     "median_spread": float(np.median(spreads)) if spreads else math.nan,
                                     "p90_spread": float(np.percentile(spreads, 90)) if spreads else math.nan}
    return out


def reach(trace: Sequence[Mapping[str, Any]], values: Sequence[float | None], goal: float) -> tuple[float, float]:
    """(measured trials, wall seconds) at which ``values`` (one per trace entry) first reached ``goal``
    (inf if never)."""
    for t, v in zip(trace, values):
        if v is not None and v <= goal:
            return float(t["measured"]), float(t["wall_s"])
    return math.inf, math.inf


def _metrics(sel: Sequence[Mapping[str, Any]], values: Sequence[Sequence[float | None]], best: float,
             within: float) -> dict[str, Any]:
    """Goal metrics of runs ``sel`` whose quality at each trace entry is ``values``; the final is the
    last value (what the run returns), not the lowest."""
    reached = [reach(r["trace"], v, best * (1 + within)) for r, v in zip(sel, values)]
    finals = [next((x for x in reversed(v) if x is not None), math.inf) / best for v in values]
    return {"best_known_ms": best, "median_trials_to_goal": float(np.median([x for x, _ in reached])),
            "median_seconds_to_goal": float(np.median([y for _, y in reached])),
            "reached": sum(math.isfinite(x) for x, _ in reached), "median_final_over_best": float(np.median(finals)),
            "trials_to_goal": [x for x, _ in reached], "seconds_to_goal": [y for _, y in reached],
            "final_over_best": finals}


def _no_metrics() -> dict[str, Any]:
    """:func:`_metrics`'s keys without values (every row has the same keys: one CSV header)."""
    scalars = ("best_known_ms", "median_trials_to_goal", "median_seconds_to_goal", "reached", "median_final_over_best")
    return {**dict.fromkeys(scalars), "trials_to_goal": [], "seconds_to_goal": [], "final_over_best": []}


def arms_of(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The arms of ``runs``, in the order of :data:`ARMS`, each recheck variant after its base arm."""
    return sorted({r["arm"] for r in runs}, key=lambda a: (ARMS.index(arm_parts(a)[0]), arm_parts(a)[1] or 0))


def summarize(runs: list[dict[str, Any]], best: dict[tuple, float], within: float,
              retimed: Mapping[WorkloadKey, Mapping[str, float]] | None = None,
              scales: Mapping[WorkloadKey, float] | None = None,
              retimed_best: Mapping[WorkloadKey, float] | None = None) -> list[dict[str, Any]]:
    """One row per (workload, arm): the goal metrics as measured, and re-timed (``retimed_*``, None or
    empty where the workload has no re-timed schedule; ``scales``: :func:`retimed_scale` per workload;
    ``retimed_best``: the best re-timed time per workload, :func:`best_retimed`; the lowest re-timed
    time where it has none)."""
    retimed, scales, retimed_best = retimed or {}, scales or {}, retimed_best or {}
    rows = []
    for (model, dataset), b in sorted(best.items()):
        times = retimed.get((model, dataset))
        for arm in arms_of(runs):
            sel = [r for r in runs if (r["model"], r["dataset"], r["arm"]) == (model, dataset, arm)]
            if not sel:
                continue
            walls = [r["trace"][-1]["wall_s"] if r["trace"] else math.nan for r in sel]
            row = {"model": model, "dataset": dataset, "arm": arm, "seeds": len(sel),
                   **_metrics(sel, [[t["best_ms"] for t in r["trace"]] for r in sel], b, within),
                   "median_proposals": float(np.median([len(r["trace"]) for r in sel])),
                   "median_wall_s": float(np.median(walls))}
            scale = scales.get((model, dataset), 1.0)
            again = (_metrics(sel, [incumbent_times(r["trace"], times, scale=scale) for r in sel],
                              retimed_best.get((model, dataset), min(times.values())), within)
                     if times else _no_metrics())
            rows.append({**row, **{f"retimed_{k}": v for k, v in again.items()}})
    return rows


def _ratios(rows: list[dict[str, Any]]) -> list[str]:
    """Each cost-model arm against tpe, per workload: as measured, and re-timed where it ran."""
    lines = []
    for model, dataset in sorted({(r["model"], r["dataset"]) for r in rows}):
        a = {r["arm"]: r for r in rows if (r["model"], r["dataset"]) == (model, dataset)}
        if "tpe" not in a:
            continue
        for arm in (x for x in arms_of(rows) if x != "tpe" and x in a):
            for prefix, how in (("", "as measured"), ("retimed_", "re-timed")):
                if a[arm][f"{prefix}best_known_ms"] is not None:
                    lines.append(_ratio_line(f"{model} {dataset} ({how})", a["tpe"], a[arm], arm, prefix))
    return lines


def _ratio_line(head: str, t: Mapping[str, Any], c: Mapping[str, Any], arm: str, prefix: str) -> str:
    tt, ct = t[f"{prefix}median_trials_to_goal"], c[f"{prefix}median_trials_to_goal"]
    ts, cs = t[f"{prefix}median_seconds_to_goal"], c[f"{prefix}median_seconds_to_goal"]
    return (f"{head}: median measured trials to within goal: tpe {tt:g} (reached {t[f'{prefix}reached']}/"
            f"{t['seeds']}), {arm} {ct:g} (reached {c[f'{prefix}reached']}/{c['seeds']}), ratio "
            f"{_ratio(ct, tt, arm)}; median seconds: tpe {ts:.0f}, {arm} {cs:.0f}, ratio {_ratio(cs, ts, arm)}")


def _ratio(a: float, b: float, arm: str) -> str:
    """a / b, where inf means "not reached within the budget" (a median over seeds can be inf)."""
    if math.isinf(a) and math.isinf(b):
        return "n/a (neither median reached the goal)"
    if math.isinf(b):
        return "< 1 (tpe's median did not reach the goal within the budget)"
    if math.isinf(a):
        return f"n/a ({arm}'s median did not reach the goal)"
    return f"{a / b:.2f}"


def plot(runs: list[dict[str, Any]], best: dict[tuple, float], path: Path, within: float,
         retimed: Mapping[WorkloadKey, Mapping[str, float]] | None = None,
         scales: Mapping[WorkloadKey, float] | None = None,
         retimed_best: Mapping[WorkloadKey, float] | None = None) -> None:
    """Quality against measured trials and wall time; re-timed where the workload was re-timed (over
    ``retimed_best``, as :func:`summarize`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    retimed, scales, retimed_best = retimed or {}, scales or {}, retimed_best or {}
    keys = sorted(best)
    fig, axes = plt.subplots(2, len(keys), figsize=(4.2 * len(keys), 7), squeeze=False)
    for col, key in enumerate(keys):
        times = retimed.get(key)
        b = retimed_best.get(key, min(times.values())) if times else best[key]
        for row, xkey in enumerate(("measured", "wall_s")):
            ax = axes[row][col]
            for arm in arms_of(runs):
                sel = [r for r in runs if (r["model"], r["dataset"], r["arm"]) == (*key, arm)]
                if not sel:
                    continue
                grid = np.linspace(0, max(t[xkey] for r in sel for t in r["trace"]), 200)
                ys = []
                for r in sel:
                    values = incumbent_times(r["trace"], times or {}, scale=scales.get(key, 1.0))  # none re-timed: as measured
                    xs = [t[xkey] for t, v in zip(r["trace"], values) if v is not None]
                    vs = [v / b for v in values if v is not None]
                    ax.step(xs, vs, where="post", alpha=0.2, lw=0.8, **_style(arm))
                    idx = np.searchsorted(xs, grid, side="right") - 1
                    ys.append(np.where(idx >= 0, np.asarray(vs)[np.maximum(idx, 0)], np.nan) if vs
                              else np.full(len(grid), np.nan))
                ys = np.asarray(ys)
                with warnings.catch_warnings():  # before a run's first ok trial its best is NaN
                    warnings.simplefilter("ignore", RuntimeWarning)
                    med = np.nanmedian(ys, axis=0)
                ax.plot(grid, med, lw=2, label=f"{arm} (median of {len(sel)})", **_style(arm))
            ax.axhline(1 + within, color="gray", ls=":", lw=1)
            ax.set_yscale("log")
            ax.set_xlabel("measured trials" if xkey == "measured" else "wall time (s)")
            ax.set_ylabel("incumbent re-timed / best re-timed" if times else "best so far (as measured) / best known")
            ax.set_title(f"{key[0]} on {key[1]}", fontsize=10)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_outputs(runs: list[dict[str, Any]], rows: list[dict[str, Any]], best: dict[tuple, float], out: Path,
                  args: argparse.Namespace, noise: dict[str, dict[str, float]],
                  detail: Mapping[WorkloadKey, Mapping[str, Mapping[str, Any]]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "tuning_curves.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "dataset", "seed", "arm", "proposal", "measured", "status", "ms", "best_ms",
                    "predicted_ms", "wall_s", "schedule_hash", "measurements"])
        for r in runs:
            for t in r["trace"]:
                w.writerow([r["model"], r["dataset"], r["seed"], r["arm"], t["proposal"], t["measured"], t["status"],
                            _f(t["ms"]), _f(t["best_ms"]), _f(t["predicted_ms"]), _f(t["wall_s"]), _f(_schedule(t)),
                            t.get("measurements", int(t["ms"] is not None))])
    flat = [{k: v for k, v in r.items() if not isinstance(v, list)} for r in rows]
    with open(out / "tuning_curves_summary.csv", "w", newline="") as f:
        w2 = csv.DictWriter(f, fieldnames=list(flat[0]) if flat else ["model"])
        w2.writeheader()
        for r in flat:
            w2.writerow({k: _f(v) if isinstance(v, float) else v for k, v in r.items()})
    _write_retimed(out / "tuning_curves_retimed.csv", detail)
    settings = {k: v for k, v in vars(args).items() if k not in ("history", "workdir", "out", "data_dir")}
    cost_models: dict[str, Any] = {}  # each cost-model arm's first run
    for r in runs:
        if r["cost_model"]:
            cost_models.setdefault(r["arm"], r["cost_model"])
    (out / "tuning_curves_summary.json").write_text(json.dumps(
        {"settings": settings, "summary": rows, "ratios": _ratios(rows), "repeat_noise": noise,
         "retimed_schedules": {f"{m} {d}": len(v) for (m, d), v in sorted(detail.items())},
         "cost_model": cost_models}, indent=1, default=str))
    plot(runs, best, out / "tuning_curves.png", args.within, _retimed_times(detail), _scales(detail),
         _retimed_bests(detail, args.best))


def _write_retimed(path: Path, detail: Mapping[WorkloadKey, Mapping[str, Mapping[str, Any]]]) -> None:
    rounds = max((len(v["rounds_ms"]) for d in detail.values() for v in d.values()), default=0)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "dataset", "schedule_hash", "knobs", "measured_ms", "relative", "retimed_ms",
                    *(f"round{i}_ms" for i in range(rounds))])
        for (model, dataset), d in sorted(detail.items()):
            for h, v in sorted(d.items(), key=lambda kv: (kv[1]["retimed_ms"] is None, kv[1]["retimed_ms"] or 0.0)):
                w.writerow([model, dataset, h, json.dumps(v["knobs"], sort_keys=True), _f(v["measured_ms"]),
                            _f(v["relative"]), _f(v["retimed_ms"]), *(_f(t) for t in v["rounds_ms"])])


def _f(x: Any) -> str:
    return "" if x is None else (f"{x:.6g}" if isinstance(x, float) else str(x))


# ---------------------------------------------------------------------- command line
def _style(arm: str) -> dict[str, str]:
    """An arm's colour (its base arm's) and line style (dashed for a recheck variant)."""
    base, recheck = arm_parts(arm)
    return {"color": COLORS[base], "ls": "-" if recheck is None else "--"}


def _arms(text: str) -> list[str]:
    """``--arms``: a comma-separated subset of :data:`ARMS`, each optionally with ``/recheck=N``, in the
    order given."""
    arms = list(dict.fromkeys(a.strip() for a in text.split(",") if a.strip()))
    try:
        bad = [a for a in arms if arm_parts(a)[0] not in ARMS]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e
    if bad or not arms:
        what = f"unknown arm(s) {', '.join(map(repr, bad))}" if bad else "no arm given"
        raise argparse.ArgumentTypeError(f"{what}; choose from {', '.join(ARMS)}, each optionally with "
                                         f"{RECHECK_VARIANT}N (the tuner's recheck for that arm)")
    return arms


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("Examples::")[1])
    p.add_argument("--history", default="sqlite:///cm_history.db",
                   help="history database from costmodel_transfer.py --collect (default sqlite:///cm_history.db)")
    p.add_argument("--models", default="hgt,rgat", help="models (default hgt,rgat)")
    p.add_argument("--datasets", default="aifb,mutag", help="datasets, ',' or ';'-separated (default aifb,mutag)")
    p.add_argument("--seeds", type=int, default=5, help="seeds per arm (default 5)")
    p.add_argument("--first-seed", type=int, default=0,
                   help="seeds run from this one (default 0; a repeat of the experiment takes new seeds)")
    p.add_argument("--budget", type=int, default=50, help="measured trials per run (default 50)")
    p.add_argument("--max-proposal-factor", type=int, default=10,
                   help="a run also stops after budget x this many proposals, pruned ones included (default 10)")
    p.add_argument("--arms", type=_arms, default=",".join(DEFAULT_ARMS),
                   help=f"comma-separated, of {', '.join(ARMS)} (default {','.join(DEFAULT_ARMS)}; tpe+rank0 is "
                        "tpe+rank without its opening, whatever --opening says, tpe+rank-local0 without local "
                        "candidates, whatever --local says, tpe+rank-lcb and tpe+rank-top with the opening "
                        "ranked by that opening_rule (lcb is the default), tpe+rank-tiles with the GEMM tile counts "
                        "as features too; ARM/recheck=N runs ARM with the "
                        "tuner's recheck N, whatever --recheck says, e.g. tpe+rank,tpe+rank/recheck=1)")
    p.add_argument("--margin", type=float, default=PrunePolicy.margin,
                   help="tpe+cm: pruning margin (default %(default)s)")
    p.add_argument("--explore", type=float, default=PrunePolicy.explore,
                   help="tpe+cm and tpe+rank: explore fraction (default %(default)s)")
    p.add_argument("--warmup", type=int, default=PrunePolicy.warmup, help="tpe+cm: measured trials before pruning")
    p.add_argument("--pool", type=int, default=16,
                   help="tpe+rank: candidates TPE proposes per measured trial (default %(default)s)")
    p.add_argument("--opening", type=int, default=RankPolicy.opening,
                   help=f"tpe+rank: the model's first picks measured after the default (default {RankPolicy.opening})")
    p.add_argument("--local", type=float, default=RankPolicy.local,
                   help="tpe+rank: fraction of each pool that changes 1-2 knobs of one of the fastest measured "
                        f"schedules instead of coming from TPE (default {RankPolicy.local}; 0: none, as in the "
                        "runs before seeds 40-44)")
    p.add_argument("--within", type=float, default=0.05, help="the goal: within this of the best known (default 0.05)")
    p.add_argument("--best", choices=BEST_ESTIMATES, default="crossfit",
                   help="how the best re-timed time is estimated: crossfit (default), the schedule fastest over "
                        "half of the re-timing rounds timed by the other half, both ways (no winner's curse); "
                        "min, the lowest re-timed median (biased low; every run before the third correction)")
    p.add_argument("--retime-rounds", type=int, default=5,
                   help="rounds of re-timing the runs' incumbents after the runs (default %(default)s; 0: no re-timing)")
    p.add_argument("--retime-window", type=float, default=0.25,
                   help="re-time incumbents measured within this of the workload's fastest time, each relative to "
                        "the default schedule's time in its run (default 0.25)")
    p.add_argument("--hidden", type=int, default=64, help="feature size (default 64)")
    p.add_argument("--backend", default=None, help="cpu (default when usable), else reference")
    p.add_argument("--trial-timeout", type=float, default=60.0, help="seconds per trial (default 60)")
    p.add_argument("--timing", default="plain", choices=TIMINGS,
                   help="how trials and re-timing rounds are timed (tune --timing): plain (default) or paired "
                        "with the default schedule, which cancels the machine's drift")
    p.add_argument("--recheck", type=int, default=TuneOptions.recheck,
                   help="the tuner's recheck (tune --recheck): a trial beating the run's best so far is measured "
                        "this many times and counts with the median (default %(default)s; 1: off, as in the runs "
                        "before seeds 50-54)")
    p.add_argument("--data-dir", default=None, help="dataset root (default $RGTUNE_DATA_DIR)")
    p.add_argument("--threads", type=int, default=None,
                   help="OpenMP threads of the measured kernels (default: the backend's); 1 on a busy machine")
    p.add_argument("--jobs", type=int, default=1,
                   help="runs side by side (GPU backends only: the device's lock keeps their timing apart, and "
                        "the time a run waited for it is left out of its seconds; default 1)")
    p.add_argument("--workdir", default="cm_curves_work", help="run databases and traces (resumable; default ./cm_curves_work)")
    p.add_argument("--out", default=str(RESULTS), help="where results go (default experiments/results)")
    p.add_argument("--quick", action="store_true", help="a smoke run: rgat on aifb, 2 seeds, 12 measured trials")
    return p


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse bad settings before hours of runs (the policies check their own parameters)."""
    if args.retime_rounds < 0 or args.retime_window < 0:
        parser.error("--retime-rounds and --retime-window must be >= 0")
    if args.best == "crossfit" and args.retime_rounds == 1:
        parser.error("--best crossfit splits the re-timing rounds in two halves: give --retime-rounds 2 or more "
                     "(or --best min)")
    if args.recheck < 1:
        parser.error(f"--recheck must be >= 1 (1: off), got {args.recheck}")
    try:
        for arm in args.arms:
            _policy(arm, args, seed=0)
    except ValueError as e:
        parser.error(str(e))


def _run_line(r: Mapping[str, Any]) -> str:
    best = min((t["best_ms"] for t in r["trace"] if t["best_ms"] is not None), default=None)
    pruned = sum(t["status"] == "pruned" for t in r["trace"])
    not_picked = ((r["cost_model"] or {}).get("counts") or {}).get("not_picked")
    skipped = f"{pruned} pruned" + (f", {not_picked} proposals not picked" if not_picked is not None else "")
    measured = r["trace"][-1]["measured"] if r["trace"] else 0
    return (f"{r['model']} {r['dataset']} seed {r['seed']} {r['arm']}: best {best} ms after {measured} measured / "
            f"{len(r['trace'])} proposed ({skipped}), {r['elapsed_s']:.0f} s")


def main(argv: Sequence[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from costmodel_transfer import canonical_dataset, default_backend, set_threads, split_names

    parser = build_parser()
    args = parser.parse_args(argv)
    _check(parser, args)
    models = split_names(args.models)
    datasets = [canonical_dataset(d, args.data_dir) for d in split_names(args.datasets)]
    if args.quick:
        models, datasets = models[-1:], datasets[:1]
        args.seeds, args.budget = min(args.seeds, 2), min(args.budget, 12)
    backend = args.backend or default_backend()
    problem = jobs_problem(args.jobs, backend)
    if problem:
        parser.error(problem)
    set_threads(args.threads)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    history = TrialDatabase(args.history)
    tasks = []
    for dataset in datasets:
        bases = {extra: prepare_base(history, dataset, workdir, backend, CostModel(), extra)
                 for extra in sorted({FEATURE_VARIANTS.get(arm_parts(a)[0], ()) for a in args.arms})}
        tasks += [(model, dataset, seed, arm, bases[FEATURE_VARIANTS.get(arm_parts(arm)[0], ())], workdir, args,
                   backend)
                  for model in models for seed in range(args.first_seed, args.first_seed + args.seeds)
                  for arm in args.arms]
    t0 = time.time()
    runs = run_parallel(run_one, tasks, args.jobs,
                        on_done=lambda r: print(f"{_run_line(r)} [{time.time() - t0:.0f} s total]", flush=True))
    for r in runs:
        backfill_knobs(r, workdir)
    best = best_known(runs, history, args.hidden, backend)
    detail = retime_all(runs, args, backend, workdir)
    rows = summarize(runs, best, args.within, _retimed_times(detail), _scales(detail), _retimed_bests(detail, args.best))
    noise = repeat_noise(workdir, runs)
    write_outputs(runs, rows, best, Path(args.out), args, noise, detail)
    for line in _ratios(rows):
        print(line)
    for key, n in noise.items():
        print(f"{key}: {n['repeated_schedules']} schedules measured in several runs; max/min - 1: median "
              f"{n['median_spread']:.2f}, 90th percentile {n['p90_spread']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
