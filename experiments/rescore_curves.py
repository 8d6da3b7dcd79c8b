"""Trials to the goal of a finished tuning-curves run, scored again from its CSVs, with and without
the measured-time scale (``tuning_curves.measured_scale``).

Runs written before the scale counted an incumbent that was not re-timed at its measured time; on
a day when the machine ran slower while re-timing, such an incumbent could count as within the
goal. This prints, per workload and arm, each seed's measured trials to within ``--within`` of the
best re-timed time both ways, so an earlier run's verdicts can be checked without running it again.

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
from curves_readout import load_traces, retimed_and_scales
from tuning_curves import incumbent_times, reach


def trials_to_goal(results: Path, within: float) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Per (model, dataset, arm): the workload's ``scale`` and each seed's trials to the goal,
    ``unscaled`` and ``scaled``."""
    retimed, scales = retimed_and_scales(results)
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for (model, dataset, arm, _), trace in sorted(load_traces(results).items()):
        key = (model, dataset)
        if key not in retimed:
            continue
        goal = min(retimed[key].values()) * (1 + within)
        scored = out.setdefault((model, dataset, arm), {"scale": scales[key], "unscaled": [], "scaled": []})
        for name, scale in (("unscaled", 1.0), ("scaled", scales[key])):
            times = incumbent_times(trace, retimed[key], schedule=lambda t: t["schedule_hash"], scale=scale)
            scored[name].append(reach(trace, times, goal)[0])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path, help="a tuning_curves.py --out folder")
    p.add_argument("--within", type=float, default=0.05, help="the goal (default 0.05)")
    args = p.parse_args(argv)
    for (model, dataset, arm), v in trials_to_goal(args.results, args.within).items():
        print(f"{model} {dataset} {arm} (scale {v['scale']:.2f}): median trials to goal unscaled "
              f"{statistics.median(v['unscaled']):g} {sorted(v['unscaled'])}, scaled "
              f"{statistics.median(v['scaled']):g} {sorted(v['scaled'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
