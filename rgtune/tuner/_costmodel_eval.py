"""Holdout evaluation (train on every other graph, rank the held-out one) and ``rgtune costmodel``."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from rgtune.tuner._costmodel_history import GraphLoader, context_for, graph_stats
from rgtune.tuner._costmodel_metrics import ranking_metrics
from rgtune.tuner._costmodel_model import ESTIMATORS, TARGETS, CostModel
from rgtune.tuner._costmodel_train import fit_on_history

if TYPE_CHECKING:
    from rgtune.tuner.db import TrialDatabase, WorkloadRecord

METRICS = ("opa", "kendall_tau", "top1_error", "top5_error")


@dataclass
class HoldoutResult:
    """Ranking metrics of a model trained without the held-out graph, on that graph's trials."""

    holdout: str
    backend: str
    device: str
    n_train: int  # ok trials trained on
    n_train_workloads: int
    status: str  # the model's status line (it may be "off": too little history)
    per_workload: list[dict[str, Any]] = field(default_factory=list)  # model, schedules, metrics
    metrics: dict[str, float] = field(default_factory=dict)  # the mean over held-out workloads

    def last_line(self) -> str:
        """``opa=<x> kendall_tau=<x> top1_error=<x> top5_error=<x>``."""
        return " ".join(f"{k}={_fmt(self.metrics.get(k, math.nan))}" for k in METRICS)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fmt(x: float) -> str:
    return "nan" if x is None or not math.isfinite(x) else f"{x:.4f}"


def _pick_group(hold: list["WorkloadRecord"]) -> tuple[str, str]:
    """The (device, backend) with the most ok trials on the held-out graph."""
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for w in hold:
        counts[(w.device, w.backend)] += w.num_ok
    return max(sorted(counts), key=lambda k: counts[k])


def evaluate_holdout(db: "TrialDatabase", holdout_dataset: str, *, model: str | None = None,
                     backend: str | None = None, device: str | None = None, cost_model: CostModel | None = None,
                     data_dir: str | None = None, graphs: GraphLoader | None = None,
                     exclude: Callable[["WorkloadRecord"], bool] | None = None,
                     keep_predictions: bool = False) -> HoldoutResult:
    """Train on every other graph's ``ok`` history (same device and backend), rank the held-out one.

    The held-out graph is excluded by name and by content (a graph recorded under two names is
    one graph). Each held-out workload (one per model and size) is ranked on its own, every
    measured schedule once (the median of its repeated measurements); the result's metrics
    are the mean over those workloads. ``exclude`` leaves more workloads out of the training
    (ablations); ``keep_predictions`` adds each schedule's ``knobs``, ``pred``, ``true`` (ms) and
    ``first`` (its first measurement, ms).

    Example:
        >>> from rgtune.tuner.db import TrialDatabase
        >>> evaluate_holdout(TrialDatabase("sqlite://"), "aifb")
        Traceback (most recent call last):
        ...
        ValueError: no trials on 'aifb' in the database (model any, backend any)
    """
    filters: dict[str, Any] = {"dataset": holdout_dataset}
    if model is not None:
        filters["model"] = model
    if backend is not None:
        filters["backend"] = backend
    hold = [w for w in db.workloads(**filters) if w.num_ok > 0 and (device is None or w.device == device)]
    if not hold:
        raise ValueError(f"no trials on {holdout_dataset!r} in the database (model {model or 'any'}, "
                         f"backend {backend or 'any'})")
    dev, be = _pick_group(hold)
    hold = [w for w in hold if w.device == dev and w.backend == be]
    hashes = {w.graph_hash for w in hold}
    graphs = graphs or GraphLoader(data_dir)
    template = cost_model or CostModel()
    fit = fit_on_history(db, template, be, dev, path=None, graphs=graphs,
                         exclude=lambda w: w.dataset == holdout_dataset or w.graph_hash in hashes
                         or (exclude is not None and exclude(w)))
    result = HoldoutResult(holdout_dataset, be, dev, len(fit.samples), len({s.workload for s in fit.samples}),
                           fit.model.status)
    if fit.model.regressor is None:
        result.metrics = {k: math.nan for k in METRICS}
        return result
    stats = graph_stats(db)
    for w in hold:
        name, chash, st = stats[w.id]
        ctx = context_for(w, name, st, graphs(name, chash))
        times: dict[str, list[float]] = defaultdict(list)
        knobs: dict[str, dict[str, Any]] = {}
        for t in db.history(w, status="ok"):
            if t.median_ms is not None and t.median_ms > 0:
                times[t.schedule_hash].append(float(t.median_ms))
                knobs[t.schedule_hash] = t.knobs
        keys = sorted(times)
        true = [float(np.median(times[k])) for k in keys]
        pred = fit.model.predict([ctx.features(knobs[k]) for k in keys])
        entry = {"workload_id": w.id, "model": w.model, "in_dim": w.in_dim, "out_dim": w.out_dim, "heads": w.heads,
                 "schedules": len(keys), "measurements": sum(len(v) for v in times.values()),
                 **ranking_metrics(pred, true)}
        if keep_predictions:
            entry.update(knobs=[knobs[k] for k in keys], pred=[float(x) for x in pred], true=true,
                         first=[times[k][0] for k in keys])
        result.per_workload.append(entry)
    result.metrics = {k: float(np.nanmean([r[k] for r in result.per_workload])) for k in METRICS}
    return result


# ---------------------------------------------------------------------- command line
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rgtune costmodel",
        description="Train the learned cost model on the trial history, or evaluate it on a held-out graph.",
        epilog="Examples:\n  rgtune costmodel --db sqlite:///results.db            # train (or refresh) and save\n"
               "  rgtune costmodel --eval --db sqlite:///results.db --holdout aifb",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", default=None, help="SQLAlchemy URL of the trial database (default sqlite:///results.db)")
    p.add_argument("--eval", action="store_true",
                   help="train on every graph but --holdout, and rank the schedules measured on --holdout")
    p.add_argument("--holdout", metavar="DATASET", help="the held-out graph (its name in the database)")
    p.add_argument("--model", help="only held-out workloads of this model")
    p.add_argument("--backend", help="only this backend (default: the one with most trials on the held-out graph)")
    p.add_argument("--device", help="only this device (its name)")
    p.add_argument("--estimator", default="hgb", choices=sorted(ESTIMATORS), help="the regressor (default hgb)")
    p.add_argument("--target", default="log_default", choices=TARGETS,
                   help="per-workload normalization of the time (default log_default)")
    p.add_argument("--data-dir", default=None, help="where the history's graphs are loaded from")
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON to PATH")
    return p


def costmodel_main(argv: Sequence[str] | None = None) -> int:
    """``rgtune costmodel ...``; evaluation ends with ``opa=<x> kendall_tau=<x> top1_error=<x> top5_error=<x>``."""
    import logging

    from rgtune.tuner._db_engine import parse_url, sqlite_file
    from rgtune.tuner.db import DEFAULT_URL, DatabaseError, TrialDatabase

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="rgtune: %(message)s")
    if args.eval and not args.holdout:
        print("rgtune costmodel: error: --eval needs --holdout DATASET", file=sys.stderr)
        return 2
    try:
        url = args.db or DEFAULT_URL
        path = sqlite_file(parse_url(url))
        if path is not None and not path.exists():  # opening would create an empty database
            raise ValueError(f"no database at {path}; run `tune` first or pass --db URL")
        db = TrialDatabase(url)
        cm = CostModel(args.estimator, args.target)
        if args.eval:
            r = evaluate_holdout(db, args.holdout, model=args.model, backend=args.backend, device=args.device,
                                 cost_model=cm, data_dir=args.data_dir)
            _print_holdout(r)
            out: dict[str, Any] = r.as_dict()
        else:
            out = {"models": _train_all(db, cm, args)}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=2, default=str)
        if args.eval:
            print(r.last_line())
        return 0
    except (ValueError, DatabaseError) as e:
        print(f"rgtune: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1


def _print_holdout(r: HoldoutResult) -> None:
    print(f"holdout {r.holdout} on {r.device} ({r.backend}): trained on {r.n_train} ok trials of "
          f"{r.n_train_workloads} other workload(s)")
    print(r.status)
    for w in r.per_workload:
        print(f"  {w['model']:<5} in={w['in_dim']} out={w['out_dim']} heads={w['heads']}: {w['schedules']} schedules  "
              + " ".join(f"{k}={_fmt(w[k])}" for k in METRICS))


def _train_all(db: "TrialDatabase", cm: CostModel, args: argparse.Namespace) -> list[dict[str, Any]]:
    groups = sorted({(w.backend, w.device) for w in db.workloads()
                     if (args.backend is None or w.backend == args.backend)
                     and (args.device is None or w.device == args.device)})
    if not groups:
        print("no trials in the database yet: nothing to train on")
    out = []
    for be, dev in groups:
        fit = fit_on_history(db, CostModel(**cm.params()), be, dev, graphs=GraphLoader(args.data_dir))
        if fit.path is None:
            where = "not saved (in-memory database)"
        else:
            where = f"{'kept at' if fit.loaded and not fit.refit else 'saved to'} {fit.path}"
        how = "refit" if fit.refit else "history unchanged: the saved model is used as it is"
        print(f"{dev} ({be}): {fit.model.status}; {how}; {where}")
        out.append({"device": dev, "backend": be, "status": fit.model.status, "path": str(fit.path)})
    return out
