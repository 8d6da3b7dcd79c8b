"""Holdout evaluation: train on every other graph, rank the held-out one (``rgtune costmodel --eval``)."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from rgtune.costmodel.history import GraphLoader, context_for, graph_stats
from rgtune.costmodel.metrics import ranking_metrics
from rgtune.costmodel.model import CostModel
from rgtune.costmodel.training import fit_on_history

if TYPE_CHECKING:
    from rgtune.db import TrialDatabase, WorkloadRecord

METRICS = ("opa", "kendall_tau", "top1_error", "top5_error", "opa_10")


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
        """``opa=<x> kendall_tau=<x> top1_error=<x> top5_error=<x> opa_10=<x>``."""
        return " ".join(f"{k}={fmt_metric(self.metrics.get(k, math.nan))}" for k in METRICS)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def fmt_metric(x: float) -> str:
    return "nan" if x is None or not math.isfinite(x) else f"{x:.4f}"


def larger_than(db: "TrialDatabase", max_edges: int) -> Callable[["WorkloadRecord"], bool]:
    """An ``exclude`` for :func:`evaluate_holdout`: the workloads on graphs of more than ``max_edges`` edges
    (a model trained on small graphs only, ranking a big one)."""
    big = {w for w, (_, _, st) in graph_stats(db).items() if int(st.get("num_edges") or 0) > max_edges}
    return lambda w: w.id in big


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
                     keep_predictions: bool = False, trust_code: bool = False,
                     rows: dict[int, dict[str, float]] | None = None, batches: str = "") -> HoldoutResult:
    """Train on every other graph's ``ok`` history (same device and backend), rank the held-out one.

    The held-out graph is excluded by name and by content (a graph recorded under two names is
    one graph). Each held-out workload (one per model and size) is ranked on its own, every
    measured schedule once (the median of its repeated measurements); the result's metrics
    are the mean over those workloads. ``exclude`` leaves more workloads out of the training
    (ablations); ``keep_predictions`` adds each schedule's ``knobs``, ``pred``, ``true`` (ms) and
    ``first`` (its first measurement, ms). ``trust_code``: import the models the history names that
    this process has not registered (:mod:`.history`). ``rows``: a cache of feature rows by trial id of
    this database, used and filled (evaluations of several held-out graphs compute each row once).
    ``batches``: rank the held-out graph's workloads tuned for this sampler (``tune --batches``; any text
    :class:`~rgtune.data.sampler_spec.SamplerSpec` parses) instead of its whole-graph ones; the training
    leaves out every workload of the held-out graph either way.

    Example:
        >>> from rgtune.db import TrialDatabase
        >>> evaluate_holdout(TrialDatabase("sqlite://"), "aifb")
        Traceback (most recent call last):
        ...
        ValueError: no trials on 'aifb' in the database (model any, backend any)
    """
    from rgtune.data.sampler_spec import SamplerSpec

    filters: dict[str, Any] = {"dataset": holdout_dataset, "batches": SamplerSpec.parse(batches).key if batches else ""}
    if model is not None:
        filters["model"] = model
    if backend is not None:
        filters["backend"] = backend
    hold = [w for w in db.workloads(**filters) if w.num_ok > 0 and (device is None or w.device == device)]
    if not hold:
        on = f"batches of {filters['batches']} from {holdout_dataset!r}" if batches else repr(holdout_dataset)
        raise ValueError(f"no trials on {on} in the database (model {model or 'any'}, backend {backend or 'any'})")
    dev, be = _pick_group(hold)
    hold = [w for w in hold if w.device == dev and w.backend == be]
    hashes = {w.graph_hash for w in hold}
    graphs = graphs or GraphLoader(data_dir)
    template = cost_model or CostModel()
    fit = fit_on_history(db, template, be, dev, path=None, graphs=graphs, trust_code=trust_code, rows=rows,
                         exclude=lambda w: w.dataset == holdout_dataset or w.graph_hash in hashes
                         or (exclude is not None and exclude(w)))
    if rows is not None:
        rows.update(fit.rows)
    result = HoldoutResult(holdout_dataset, be, dev, len(fit.samples), len({s.workload for s in fit.samples}),
                           fit.model.status)
    if fit.model.regressor is None:
        result.metrics = {k: math.nan for k in METRICS}
        return result
    stats = graph_stats(db)
    for w in hold:
        name, chash, st = stats[w.id]
        ctx = context_for(w, name, st, graphs(name, chash), trust_code)
        times: dict[str, list[float]] = defaultdict(list)
        knobs: dict[str, dict[str, Any]] = {}
        for t in db.history(w, status="ok"):
            if t.median_ms is not None and t.median_ms > 0:
                times[t.schedule_hash].append(float(t.median_ms))
                knobs[t.schedule_hash] = t.knobs
        keys = sorted(times)
        true = [float(np.median(times[k])) for k in keys]
        pred = fit.model.predict([ctx.features(knobs[k]) for k in keys])
        entry = {"workload_id": w.id, "model": w.model, "mode": w.mode, "in_dim": w.in_dim, "out_dim": w.out_dim, "heads": w.heads,
                 "schedules": len(keys), "measurements": sum(len(v) for v in times.values()),
                 **ranking_metrics(pred, true)}
        if keep_predictions:
            entry.update(knobs=[knobs[k] for k in keys], pred=[float(x) for x in pred], true=true,
                         first=[times[k][0] for k in keys])
        result.per_workload.append(entry)
    result.metrics = {k: float(np.nanmean([r[k] for r in result.per_workload])) for k in METRICS}
    return result
