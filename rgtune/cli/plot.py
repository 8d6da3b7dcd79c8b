"""``rgtune plot``: a workload's tuning as a picture (PNG): every searched trial's time and the best so far,
against the trials searched and against the search's seconds (the trials' own: the pauses between two
``tune`` runs of a workload left out), the confirmed best, and which knobs mattered.

The knobs' importances are Optuna's fANOVA (:class:`optuna.importance.FanovaImportanceEvaluator`, a
fixed seed) over the study's measured trials: the share of the variance of the time that each knob
explains. It needs ``matplotlib`` (``pip install 'rgtune[plot]'``).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from rgtune.cli._common import CLIError, open_query_db
from rgtune.cli._query import add_workload_filters, filters

#: knobs shown in the importance panel (the most important first)
_TOP_KNOBS = 12


def add_parser(sub: argparse._SubParsersAction) -> None:
    about = "plot a workload's tuning: times and the best so far per trial and over time, and the knobs' importances"
    p = sub.add_parser("plot", help=about, description=about[0].upper() + about[1:] + " (PNG; needs matplotlib). "
                       "The filters must select one workload.")
    add_workload_filters(p, model_required=True)
    p.add_argument("-o", "--output", type=Path, default=None,
                   help="the PNG to write (default: tuning-MODEL-DATASET.png in the current folder)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise CLIError("rgtune plot needs matplotlib: pip install 'rgtune[plot]'") from None
    db = open_query_db(args.db, "rgtune plot")
    found = db.workloads(**filters(args))
    if not found:
        raise CLIError("no workload matches; run `tune` for it first (`rgtune history` lists what is recorded)")
    if len(found) > 1:
        listed = "; ".join(f"{w.model} on {w.dataset} ({w.backend}, {w.mode}, {w.in_dim}->{w.out_dim}, "
                           f"{w.num_trials} trials)" for w in found[:6])
        raise CLIError(f"{len(found)} workloads match ({listed}); narrow it with --dataset, --backend, --hidden, "
                       "--heads or --mode")
    (workload,) = found
    trials = [t for t in db.history(workload) if t.confirmation_id is None]  # the search's, in the order they ran
    # x axes: the trial's place in the search and the search's own seconds up to its end (the trials' time:
    # the pauses between two `tune` runs of the workload left out)
    place, spent, elapsed = {}, {}, 0.0
    for i, t in enumerate(trials):
        elapsed += ((t.finished_at or t.started_at) - t.started_at).total_seconds()
        place[t.id], spent[t.id] = i + 1, elapsed
    ok = [t for t in trials if t.status == "ok" and t.median_ms is not None]
    if not ok:
        raise CLIError(f"workload {workload.study_name} has no measured trial of its search to plot")
    best = db.best(workload)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6), gridspec_kw={"width_ratios": [1, 1, 1.1]})
    _progress(axes[0], [place[t.id] for t in ok], ok, best, "trials searched")
    _progress(axes[1], [spent[t.id] for t in ok], ok, best, "seconds of search (the trials' own)")
    _importances(axes[2], ok)
    on = f"batches of {workload.batches} from {workload.dataset}" if workload.batches else workload.dataset
    fig.suptitle(f"{workload.model} on {on}, {workload.mode}, {workload.in_dim}->{workload.out_dim}, "
                 f"{workload.backend} ({workload.device}): {len(trials)} trials, {len(ok)} measured")
    fig.tight_layout()
    out = args.output or Path(f"tuning-{workload.model}-{workload.dataset}.png".replace("/", "_").replace(":", "_"))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    print(f"wrote {out}")
    return 0


def _progress(ax: Any, xs: list[float], ok: list[Any], best: Any, xlabel: str) -> None:
    """Each measured trial's time and the best so far (a step), and the confirmed best as a line."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    xs, times = [xs[i] for i in order], [ok[i].median_ms for i in order]
    running, so_far = [], math.inf
    for t in times:
        so_far = min(so_far, t)
        running.append(so_far)
    ax.scatter(xs, times, s=12, alpha=0.45, label="a trial's time")
    ax.step(xs, running, where="post", color="C1", label="best so far")
    if best is not None and best.median_ms is not None:
        ax.axhline(best.median_ms, color="C2", linestyle="--", linewidth=1, label=f"best, confirmed ({best.median_ms:.3g} ms)")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("ms (log)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)


def knob_importances(trials: list[Any]) -> dict[str, float]:
    """Optuna's fANOVA importance of each knob over measured trials (records with ``knobs`` and
    ``median_ms``), most important first; a knob with one value is left out, fewer than 4 trials give none."""
    import optuna
    from optuna.distributions import CategoricalDistribution
    from optuna.importance import FanovaImportanceEvaluator, get_param_importances

    values: dict[str, set[Any]] = {}
    for t in trials:
        for k, v in t.knobs.items():
            values.setdefault(k, set()).add(v)
    dists = {k: CategoricalDistribution(sorted(vs, key=repr)) for k, vs in values.items() if len(vs) > 1}
    if len(trials) < 4 or not dists:
        return {}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()  # in memory: the database is opened read-only
    for t in trials:
        params = {k: t.knobs[k] for k in dists if k in t.knobs}
        study.add_trial(optuna.trial.create_trial(params=params, distributions={k: dists[k] for k in params},
                                                  value=t.median_ms))
    return dict(get_param_importances(study, evaluator=FanovaImportanceEvaluator(seed=0)))


def _importances(ax: Any, ok: list[Any]) -> None:
    ax.set_title("knob importance (fANOVA, share of the time's variance)", fontsize=9)
    importances = knob_importances(ok)
    if not importances:
        ax.text(0.5, 0.5, "too few measured trials\nor no knob that varied", ha="center", va="center")
        ax.set_axis_off()
        return
    top = list(importances.items())[:_TOP_KNOBS][::-1]
    ax.barh([k for k, _ in top], [v for _, v in top], color="C0")
    ax.tick_params(axis="y", labelsize=8)
    ax.set_xlabel("importance")
    ax.grid(alpha=0.3, axis="x")
