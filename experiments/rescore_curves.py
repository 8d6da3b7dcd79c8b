"""Trials to the goal of a finished tuning-curves run, scored again from its CSVs the three ways the
experiment has scored an incumbent that was not re-timed.

* ``raw``: at its measured time (runs written before the first correction of 2026-11-25). On a day
  when the machine ran slower while re-timing, such an incumbent could count as within the goal.
* ``measured``: at its measured time times the workload's best re-timed over fastest measured time
  (the first correction). A run measured in a slow process still counted its incumbents far off the
  best, however close they were.
* ``relative``: at its time relative to its run's default schedule, put on the re-timing's scale
  (``tuning_curves.best_relative``; the second correction).

Those three judge against the lowest re-timed median. ``crossfit`` scores as ``relative`` does,
against the best re-timed time without the winner's curse (``tuning_curves.crossfit_best``, the
third correction, how ``tuning_curves.py`` scores now); a run whose CSV lacks each round's time has
no ``crossfit`` score.

Which schedules were re-timed is the run's own (rescoring does not time anything), so a run written
before the re-timing window became relative keeps its re-timed set. This prints, per workload and
arm, each seed's measured trials to within ``--within`` of the best re-timed time each way, and each
arm's verdict on the issue's goal against ``tpe`` each way, so an earlier run's verdicts can be
checked without running it again.

    python experiments/rescore_curves.py experiments/results/tuning_curves_opening_ablation
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from curves_readout import (
    csv_schedule,
    load_retimed,
    load_summary,
    load_traces,
    verdict,
)
from tuning_curves import incumbent_times, reach

#: how each scoring puts an incumbent that was not re-timed on the re-timing's scale (relative to its
#: run's default, the scale of ``curves_readout.load_retimed`` it is multiplied by; None: none), and
#: how it estimates the best re-timed time (``tuning_curves.BEST_ESTIMATES``)
SCORINGS: dict[str, tuple[bool, str | None, str]] = {
    "raw": (False, None, "min"), "measured": (False, "measured", "min"), "relative": (True, "relative", "min"),
    "crossfit": (True, "relative", "crossfit")}


def trials_to_goal(results: Path, within: float) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Per (model, dataset, arm): the workload's ``scales`` (measured and relative) and, per scoring of
    :data:`SCORINGS`, each seed's trials to the goal (and under ``seconds``, each seed's seconds); a
    scoring whose best estimate the run's CSV cannot give (``crossfit`` without the rounds) is left out."""
    traces = load_traces(results)
    retimed, scales, bests = load_retimed(results, traces)
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for (model, dataset, arm, _), trace in sorted(traces.items()):
        key = (model, dataset)
        if key not in retimed:
            continue
        names = [name for name, (_, _, best) in SCORINGS.items() if key in bests[best]]
        scored = out.setdefault((model, dataset, arm), {
            "scales": {kind: scales[kind][key] for kind in ("measured", "relative")},
            **{name: [] for name in names}, "seconds": {name: [] for name in names}})
        for name in names:
            relative, kind, best = SCORINGS[name]
            times = incumbent_times(trace, retimed[key], schedule=csv_schedule, relative=relative,
                                    scale=scales[kind][key] if kind else 1.0)
            trials, seconds = reach(trace, times, bests[best][key] * (1 + within))
            scored[name].append(trials)
            scored["seconds"][name].append(seconds)
    return out


def verdicts(scored: dict[tuple[str, str, str], dict[str, Any]], budget: int,
             baseline: str = "tpe") -> dict[tuple[str, str, str], dict[str, str]]:
    """Per (model, dataset, arm) other than ``baseline``: the goal's verdict against the baseline
    (``curves_readout.verdict``, from medians over seeds) under each scoring."""
    out: dict[tuple[str, str, str], dict[str, str]] = {}
    for (model, dataset, arm), v in scored.items():
        base = scored.get((model, dataset, baseline))
        if arm == baseline or base is None:
            continue
        out[(model, dataset, arm)] = {
            name: verdict(statistics.median(base[name]), statistics.median(base["seconds"][name]),
                          statistics.median(v[name]), statistics.median(v["seconds"][name]), budget)
            for name in SCORINGS if name in v and name in base}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path, help="a tuning_curves.py --out folder")
    p.add_argument("--within", type=float, default=0.05, help="the goal (default 0.05)")
    args = p.parse_args(argv)
    scored = trials_to_goal(args.results, args.within)
    for (model, dataset, arm), v in scored.items():
        scorings = ", ".join(f"{name} {statistics.median(v[name]):g} {sorted(v[name])}" for name in SCORINGS
                             if name in v)
        print(f"{model} {dataset} {arm} (scale {v['scales']['measured']:.2f} measured, "
              f"{v['scales']['relative']:.3g} relative): median trials to goal {scorings}")
    for (model, dataset, arm), v in verdicts(scored, load_summary(args.results).budget).items():
        print(f"{model} {dataset} {arm} against tpe: " + ", ".join(f"{name} {x}" for name, x in v.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
