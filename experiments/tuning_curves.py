"""Tuning curves with and without the learned cost model: best-so-far vs measured trials and wall time.

For each (model, dataset, seed) two studies run through the real tuning loop
(:class:`rgtune.tuner.study.Tuner`, CPU kernels by default), with the same budget of
*measured* trials:

* ``tpe``: Optuna's TPE alone;
* ``tpe+cm``: the same sampler and seed, with :class:`~rgtune.tuner.costmodel.CostModelPruner`
  as ``TuneOptions.pruner``. Its history is every other graph's trials (the history
  database of ``costmodel_transfer.py --collect`` minus the tuned graph: leave-graph-out),
  plus what the study measures as it goes (the loop calls its ``observe``).

Every run gets its own copy of that history database (so no run sees another run's trials)
and its own kernel cache (so no run reuses another's compiled kernels). The best known
schedule of a workload is the fastest ``ok`` trial over all runs and the history. A run
reaches the goal when its best-so-far is within ``--within`` (5%) of that.

Outputs (``--out``, default ``experiments/results``): ``tuning_curves.csv`` (every trial of
every run), ``tuning_curves_summary.csv`` and ``.json`` (trials and seconds to the goal,
medians over seeds), ``tuning_curves.png``.

Examples::

    python experiments/tuning_curves.py --help
    python experiments/tuning_curves.py --history sqlite:///cm_history.db              # the full run
    python experiments/tuning_curves.py --history sqlite:///cm_history.db --quick      # a smoke run
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sqlite3
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from rgtune.tuner.costmodel import CostModel, CostModelPruner, PrunePolicy, fit_on_history
from rgtune.tuner.db import DeviceInfo, TrialDatabase
from rgtune.tuner.measure import MeasureResult, Workload
from rgtune.tuner.study import UNMEASURED, TuneOptions, Tuner

RESULTS = Path(__file__).resolve().parent / "results"
ARMS = ("tpe", "tpe+cm")


# ---------------------------------------------------------------------- the loop, instrumented
class CurveTuner(Tuner):
    """A :class:`Tuner` that traces every trial (the loop itself counts the measured-trial budget
    and does the cost model's wiring: ``bind``, ``observe`` after each measured trial, ``close``)."""

    def __init__(self, workload: Workload, db: TrialDatabase, options: TuneOptions) -> None:
        super().__init__(workload, db, options)
        self.measured, self.best = 0, math.inf
        self.trace: list[dict[str, Any]] = []
        self.setup_s = 0.0

    def run(self) -> Any:
        self._t0 = time.perf_counter()
        return super().run()

    def _setup(self) -> None:
        super()._setup()
        self.setup_s = time.perf_counter() - self._t0

    def _evaluate(self, config: dict[str, Any], point: Any, number: int) -> MeasureResult:
        result = super()._evaluate(config, point, number)
        ms = result.median * 1e3 if result.status == "ok" and result.median is not None else None
        if result.status not in UNMEASURED:
            self.measured += 1
            if ms is not None:
                self.best = min(self.best, ms)
        self.trace.append({"proposal": len(self.trace) + 1, "measured": self.measured, "status": result.status,
                           "ms": ms, "best_ms": self.best if math.isfinite(self.best) else None,
                           "predicted_ms": result.info.get("predicted_ms"),
                           "wall_s": time.perf_counter() - self._t0})
        return result


# ---------------------------------------------------------------------- history copies
def copy_history(src: TrialDatabase, dst_url: str, exclude_dataset: str) -> TrialDatabase:
    """A new database with ``src``'s finished trials, except those on ``exclude_dataset``.

    Written through :class:`TrialDatabase` (devices, graphs and knobs as recorded), and without
    Optuna's tables: a study on the copy starts from nothing, only the cost model sees history.
    """
    import sqlalchemy as sa

    from rgtune.tuner._db_models import Device, Graph, Workload as W

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


def prepare_base(history: TrialDatabase, dataset: str, workdir: Path, backend: str, cm: CostModel) -> Path:
    """The leave-``dataset``-out history, with its cost model trained and saved next to it."""
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
    db = TrialDatabase(f"sqlite:///{base}")
    fit = fit_on_history(db, cm, backend, _main_device(db, backend))
    print(f"history without {dataset}: {fit.model.status} ({'loaded' if fit.loaded else 'trained'}, "
          f"{len(fit.samples)} trials)", flush=True)
    db.close()
    return base


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _fresh_cache(run_dir: Path) -> None:
    """A kernel cache of this run's own; processed graphs are linked from the shared cache."""
    from rgtune.data._cache import processed_dir

    shared = processed_dir()
    cache = run_dir / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    if shared.is_dir():
        for f in shared.glob("*.pt"):
            link = cache / f.name
            if not link.exists():
                link.symlink_to(f.resolve())
    os.environ["RGTUNE_CACHE_DIR"] = str(cache)  # the measurement worker is spawned with this environment


# ---------------------------------------------------------------------- one run
def run_one(model: str, dataset: str, seed: int, arm: str, base: Path, workdir: Path, args: argparse.Namespace,
            backend: str) -> dict[str, Any]:
    from rgtune.tuner.measure import MeasureOptions

    run_dir = workdir / "runs" / f"{model}-{_safe(dataset)}-s{seed}-{arm.replace('+', '_')}"
    done = run_dir / "trace.json"
    if done.exists():
        return json.loads(done.read_text())
    run_dir.mkdir(parents=True, exist_ok=True)
    db_path = run_dir / "results.db"
    for p in (db_path, Path(f"{db_path}-wal"), Path(f"{db_path}-shm")):
        p.unlink(missing_ok=True)
    _sqlite_copy(base, db_path)
    saved = Path(f"{base}.costmodel")
    if arm == "tpe+cm" and saved.is_dir():  # the model trained on the base history, next to the database
        target = Path(f"{db_path}.costmodel")
        target.mkdir(exist_ok=True)
        for f in saved.iterdir():
            (target / f.name).write_bytes(f.read_bytes())
    shared_cache = os.environ.get("RGTUNE_CACHE_DIR")
    _fresh_cache(run_dir)
    pruner = None
    if arm == "tpe+cm":
        pruner = CostModelPruner(CostModel(), PrunePolicy(margin=args.margin, explore=args.explore,
                                                          warmup=args.warmup, seed=seed), data_dir=args.data_dir)
    db = TrialDatabase(f"sqlite:///{db_path}")
    opts = TuneOptions(trials=args.budget, sampler="tpe", seed=seed, progress=False,
                       measure=MeasureOptions(timeout=args.trial_timeout), pruner=pruner,
                       max_proposals_per_trial=args.max_proposal_factor)
    tuner = CurveTuner(Workload(model, dataset, args.hidden, args.hidden, 1, backend, args.data_dir), db, opts)
    t0 = time.time()
    try:
        summary = tuner.run()
    finally:
        if shared_cache is None:
            os.environ.pop("RGTUNE_CACHE_DIR", None)
        else:
            os.environ["RGTUNE_CACHE_DIR"] = shared_cache
    out = {"model": model, "dataset": dataset, "seed": seed, "arm": arm, "budget": args.budget,
           "setup_s": tuner.setup_s, "elapsed_s": time.time() - t0, "statuses": summary.statuses,
           "cost_model": pruner.describe() if pruner is not None else None, "trace": tuner.trace}
    done.write_text(json.dumps(out, default=str))
    db.close()
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
        path = workdir / "runs" / f"{r['model']}-{_safe(r['dataset'])}-s{r['seed']}-{r['arm'].replace('+', '_')}"
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


def _reach(trace: list[dict[str, Any]], goal: float) -> tuple[float, float]:
    """(measured trials, wall seconds) at which the best-so-far first reached ``goal`` (inf if never)."""
    for t in trace:
        if t["best_ms"] is not None and t["best_ms"] <= goal:
            return float(t["measured"]), float(t["wall_s"])
    return math.inf, math.inf


def summarize(runs: list[dict[str, Any]], best: dict[tuple, float], within: float) -> list[dict[str, Any]]:
    rows = []
    for (model, dataset), b in sorted(best.items()):
        for arm in ARMS:
            sel = [r for r in runs if (r["model"], r["dataset"], r["arm"]) == (model, dataset, arm)]
            if not sel:
                continue
            reach = [_reach(r["trace"], b * (1 + within)) for r in sel]
            finals = [min((t["best_ms"] for t in r["trace"] if t["best_ms"] is not None), default=math.inf) / b
                      for r in sel]
            proposals = [len(r["trace"]) for r in sel]
            walls = [r["trace"][-1]["wall_s"] if r["trace"] else math.nan for r in sel]
            rows.append({"model": model, "dataset": dataset, "arm": arm, "seeds": len(sel), "best_known_ms": b,
                         "median_trials_to_goal": float(np.median([x for x, _ in reach])),
                         "median_seconds_to_goal": float(np.median([y for _, y in reach])),
                         "reached": sum(math.isfinite(x) for x, _ in reach),
                         "median_final_over_best": float(np.median(finals)),
                         "median_proposals": float(np.median(proposals)),
                         "median_wall_s": float(np.median(walls)),
                         "trials_to_goal": [x for x, _ in reach], "seconds_to_goal": [y for _, y in reach]})
    return rows


def _ratios(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for model, dataset in sorted({(r["model"], r["dataset"]) for r in rows}):
        a = {r["arm"]: r for r in rows if (r["model"], r["dataset"]) == (model, dataset)}
        if set(a) != set(ARMS):
            continue
        t, c = a["tpe"], a["tpe+cm"]
        lines.append(f"{model} {dataset}: median measured trials to within goal: tpe {t['median_trials_to_goal']:g} "
                     f"(reached {t['reached']}/{t['seeds']}), tpe+cm {c['median_trials_to_goal']:g} (reached "
                     f"{c['reached']}/{c['seeds']}), ratio {_ratio(c['median_trials_to_goal'], t['median_trials_to_goal'])}"
                     f"; median seconds: tpe {t['median_seconds_to_goal']:.0f}, tpe+cm {c['median_seconds_to_goal']:.0f}, "
                     f"ratio {_ratio(c['median_seconds_to_goal'], t['median_seconds_to_goal'])}")
    return lines


def _ratio(a: float, b: float) -> str:
    """a / b, where inf means "not reached within the budget" (a median over seeds can be inf)."""
    if math.isinf(a) and math.isinf(b):
        return "n/a (neither median reached the goal)"
    if math.isinf(b):
        return "< 1 (tpe's median did not reach the goal within the budget)"
    if math.isinf(a):
        return "n/a (tpe+cm's median did not reach the goal)"
    return f"{a / b:.2f}"


def plot(runs: list[dict[str, Any]], best: dict[tuple, float], path: Path, within: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted(best)
    fig, axes = plt.subplots(2, len(keys), figsize=(4.2 * len(keys), 7), squeeze=False)
    colors = {"tpe": "tab:blue", "tpe+cm": "tab:red"}
    for col, key in enumerate(keys):
        for row, xkey in enumerate(("measured", "wall_s")):
            ax = axes[row][col]
            for arm in ARMS:
                sel = [r for r in runs if (r["model"], r["dataset"], r["arm"]) == (*key, arm)]
                if not sel:
                    continue
                grid = np.linspace(0, max(t[xkey] for r in sel for t in r["trace"]), 200)
                ys = []
                for r in sel:
                    xs = [t[xkey] for t in r["trace"] if t["best_ms"] is not None]
                    vs = [t["best_ms"] / best[key] for t in r["trace"] if t["best_ms"] is not None]
                    ax.step(xs, vs, where="post", color=colors[arm], alpha=0.2, lw=0.8)
                    idx = np.searchsorted(xs, grid, side="right") - 1
                    ys.append(np.where(idx >= 0, np.asarray(vs)[np.maximum(idx, 0)], np.nan))
                ys = np.asarray(ys)
                with warnings.catch_warnings():  # before a run's first ok trial its best is NaN
                    warnings.simplefilter("ignore", RuntimeWarning)
                    med = np.nanmedian(ys, axis=0)
                ax.plot(grid, med, color=colors[arm], lw=2, label=f"{arm} (median of {len(sel)})")
            ax.axhline(1 + within, color="gray", ls=":", lw=1)
            ax.set_yscale("log")
            ax.set_xlabel("measured trials" if xkey == "measured" else "wall time (s)")
            ax.set_ylabel("best so far / best known")
            ax.set_title(f"{key[0]} on {key[1]}", fontsize=10)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_outputs(runs: list[dict[str, Any]], rows: list[dict[str, Any]], best: dict[tuple, float], out: Path,
                  args: argparse.Namespace, noise: dict[str, dict[str, float]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "tuning_curves.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "dataset", "seed", "arm", "proposal", "measured", "status", "ms", "best_ms",
                    "predicted_ms", "wall_s"])
        for r in runs:
            for t in r["trace"]:
                w.writerow([r["model"], r["dataset"], r["seed"], r["arm"], t["proposal"], t["measured"], t["status"],
                            _f(t["ms"]), _f(t["best_ms"]), _f(t["predicted_ms"]), _f(t["wall_s"])])
    flat = [{k: v for k, v in r.items() if not isinstance(v, list)} for r in rows]
    with open(out / "tuning_curves_summary.csv", "w", newline="") as f:
        w2 = csv.DictWriter(f, fieldnames=list(flat[0]) if flat else ["model"])
        w2.writeheader()
        for r in flat:
            w2.writerow({k: _f(v) if isinstance(v, float) else v for k, v in r.items()})
    settings = {k: v for k, v in vars(args).items() if k not in ("history", "workdir", "out", "data_dir")}
    (out / "tuning_curves_summary.json").write_text(json.dumps(
        {"settings": settings, "summary": rows, "ratios": _ratios(rows), "repeat_noise": noise,
         "cost_model": next((r["cost_model"] for r in runs if r["cost_model"]), None)}, indent=1, default=str))
    plot(runs, best, out / "tuning_curves.png", args.within)


def _f(x: Any) -> str:
    return "" if x is None else (f"{x:.6g}" if isinstance(x, float) else str(x))


# ---------------------------------------------------------------------- command line
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("Examples::")[1])
    p.add_argument("--history", default="sqlite:///cm_history.db",
                   help="history database from costmodel_transfer.py --collect (default sqlite:///cm_history.db)")
    p.add_argument("--models", default="hgt,rgat", help="models (default hgt,rgat)")
    p.add_argument("--datasets", default="aifb,mutag", help="datasets, ',' or ';'-separated (default aifb,mutag)")
    p.add_argument("--seeds", type=int, default=5, help="seeds per arm (default 5)")
    p.add_argument("--budget", type=int, default=50, help="measured trials per run (default 50)")
    p.add_argument("--max-proposal-factor", type=int, default=10,
                   help="a run also stops after budget x this many proposals, pruned ones included (default 10)")
    p.add_argument("--arms", default=",".join(ARMS), help="tpe, tpe+cm (default both)")
    p.add_argument("--margin", type=float, default=PrunePolicy.margin, help="pruning margin (default %(default)s)")
    p.add_argument("--explore", type=float, default=PrunePolicy.explore, help="explore fraction (default %(default)s)")
    p.add_argument("--warmup", type=int, default=PrunePolicy.warmup, help="measured trials before pruning")
    p.add_argument("--within", type=float, default=0.05, help="the goal: within this of the best known (default 0.05)")
    p.add_argument("--hidden", type=int, default=64, help="feature size (default 64)")
    p.add_argument("--backend", default=None, help="cpu (default when usable), else reference")
    p.add_argument("--trial-timeout", type=float, default=60.0, help="seconds per trial (default 60)")
    p.add_argument("--data-dir", default=None, help="dataset root (default $RGTUNE_DATA_DIR)")
    p.add_argument("--threads", type=int, default=None,
                   help="OpenMP threads of the measured kernels (default: the backend's); 1 on a busy machine")
    p.add_argument("--workdir", default="cm_curves_work", help="run databases and traces (resumable; default ./cm_curves_work)")
    p.add_argument("--out", default=str(RESULTS), help="where results go (default experiments/results)")
    p.add_argument("--quick", action="store_true", help="a smoke run: rgat on aifb, 2 seeds, 12 measured trials")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from costmodel_transfer import canonical_dataset, default_backend, set_threads, split_names

    args = build_parser().parse_args(argv)
    models = split_names(args.models)
    datasets = [canonical_dataset(d, args.data_dir) for d in split_names(args.datasets)]
    if args.quick:
        models, datasets = models[-1:], datasets[:1]
        args.seeds, args.budget = min(args.seeds, 2), min(args.budget, 12)
    arms = [a for a in args.arms.split(",") if a]
    backend = args.backend or default_backend()
    set_threads(args.threads)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    history = TrialDatabase(args.history)
    runs = []
    t0 = time.time()
    for dataset in datasets:
        base = prepare_base(history, dataset, workdir, backend, CostModel())
        for model in models:
            for seed in range(args.seeds):
                for arm in arms:
                    r = run_one(model, dataset, seed, arm, base, workdir, args, backend)
                    runs.append(r)
                    best = min((t["best_ms"] for t in r["trace"] if t["best_ms"] is not None), default=None)
                    pruned = sum(t["status"] == "pruned" for t in r["trace"])
                    print(f"{model} {dataset} seed {seed} {arm}: best {best} ms after {r['trace'][-1]['measured']} "
                          f"measured / {len(r['trace'])} proposed ({pruned} pruned), {r['elapsed_s']:.0f} s "
                          f"[{time.time() - t0:.0f} s total]", flush=True)
    best = best_known(runs, history, args.hidden, backend)
    rows = summarize(runs, best, args.within)
    noise = repeat_noise(workdir, runs)
    write_outputs(runs, rows, best, Path(args.out), args, noise)
    for line in _ratios(rows):
        print(line)
    for key, n in noise.items():
        print(f"{key}: {n['repeated_schedules']} schedules measured in several runs; max/min - 1: median "
              f"{n['median_spread']:.2f}, 90th percentile {n['p90_spread']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
