"""How much one trial's time varies, timed plain and paired with the default schedule.

A plain trial (the median of a block of runs) carries the drift of a shared machine's speed; a
paired trial (``MeasureOptions(timing="paired")``) alternates every run with a run of the default
schedule, so a drift common to both cancels. For one workload this times the default schedule and
``--schedules`` others in ``--workers`` fresh measurement processes per mode (plain and paired
alternating), ``--rounds`` interleaved rounds each, one trial per schedule and round, and reports
standard deviations of log time: ``sd_within`` (a schedule over the rounds of one process),
``sd_pair`` (the log ratio of two schedules timed in the same round: the tuner's comparison) and
``sd_between`` (a schedule's per-process median). The schedules: the fastest of ``--schedules-from``
(a ``tuning_curves_retimed.csv``; by default the near-ties of the seed-23 curves). Writes
``timing_noise_<model>_<dataset>.csv`` (every trial) and ``.json`` (the summary) to ``--out``.

Examples::

    python experiments/timing_noise.py --model hgt --dataset aifb --workers 3 --rounds 5
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from rgtune.tuner.measure import TIMINGS, MeasureOptions, Workload, measure_rounds

RESULTS = Path(__file__).resolve().parent / "results" / "timing_noise"
_REPO = RESULTS.parents[2]


def _shown(value: object) -> str:
    """A setting as the results record it: a path inside the repository relative to it, another path by
    its name only (results must not carry this machine's paths).

    Example:
        >>> _shown(_REPO / "experiments" / "results"), _shown(Path("/somewhere/else/out")), _shown(3)
        ('experiments/results', 'out', '3')
    """
    if isinstance(value, Path):
        path = value.resolve()
        return str(path.relative_to(_REPO)) if path.is_relative_to(_REPO) else path.name
    return str(value)


def pick_schedules(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The default schedule and the ``args.schedules`` fastest re-timed ones of ``--schedules-from``, by name."""
    with open(args.schedules_from, newline="") as f:
        rows = [r for r in csv.DictReader(f) if (r["model"], r["dataset"]) == (args.model, args.dataset)
                and r["retimed_ms"]]
    if not rows:
        raise SystemExit(f"timing_noise: no re-timed {args.model} {args.dataset} schedule in {args.schedules_from}")
    rows.sort(key=lambda r: float(r["retimed_ms"]))
    return {"default": {}, **{f"fast{i}": json.loads(r["knobs"]) for i, r in enumerate(rows[:args.schedules])}}


def summarize(log_ms: Mapping[str, Mapping[str, np.ndarray]]) -> dict[str, dict[str, float]]:
    """Per timing mode: ``log_ms[mode][schedule]`` is a (processes x rounds) array of log times."""
    out = {}
    for mode, by_schedule in log_ms.items():
        names = sorted(by_schedule)
        within = np.mean([by_schedule[n].std(axis=1).mean() for n in names])
        between = np.mean([np.median(by_schedule[n], axis=1).std() for n in names])
        pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
        pair = np.mean([(by_schedule[a] - by_schedule[b]).std(axis=1).mean() for a, b in pairs]) if pairs else np.nan
        out[mode] = {"sd_within": float(within), "sd_pair": float(pair), "sd_between": float(between)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="hgt", choices=("rgcn", "rgat", "hgt"))
    p.add_argument("--dataset", default="aifb")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--schedules", type=int, default=3, help="schedules besides the default (default 3)")
    p.add_argument("--schedules-from", type=Path, default=RESULTS / "schedules.csv",
                   help="a tuning_curves_retimed.csv: its fastest schedules (default: the seed-23 curves' six)")
    p.add_argument("--workers", type=int, default=3, help="measurement processes per timing mode (default 3)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds per process (default 5)")
    p.add_argument("--data-dir", default=os.environ.get("RGTUNE_DATA_DIR"))
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.workers < 2 or args.rounds < 2 or args.schedules < 1:
        p.error("--workers and --rounds must be >= 2 and --schedules >= 1 (a spread needs two of each)")
    schedules = pick_schedules(args)
    workload = Workload(args.model, args.dataset, args.hidden, args.hidden, 1, "cpu", args.data_dir)
    rows: list[dict[str, Any]] = []
    log_ms: dict[str, dict[str, list[list[float]]]] = {mode: {n: [] for n in schedules} for mode in TIMINGS}
    t0 = time.perf_counter()
    for process in range(args.workers):
        for mode in TIMINGS:
            seconds = measure_rounds(workload, schedules, args.rounds, MeasureOptions(timing=mode))
            for name, times in seconds.items():
                if any(t is None for t in times):
                    raise SystemExit(f"timing_noise: schedule {name} failed in a {mode} round: {schedules[name]}")
                log_ms[mode][name].append([float(np.log(t * 1e3)) for t in times])
                rows += [{"timing": mode, "process": process, "schedule": name, "round": r, "ms": t * 1e3}
                         for r, t in enumerate(times)]
            print(f"process {process + 1}/{args.workers} {mode}: {time.perf_counter() - t0:.0f} s", flush=True)
    summary = summarize({m: {n: np.array(v) for n, v in d.items()} for m, d in log_ms.items()})
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"timing_noise_{args.model}_{args.dataset}"
    with open(f"{stem}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    settings = {k: _shown(v) for k, v in vars(args).items() if k != "data_dir"}  # no paths of this machine
    Path(f"{stem}.json").write_text(json.dumps({"settings": settings,
                                                "schedules": schedules, "summary": summary}, indent=1))
    print("| timing | sd within a process | sd of a two-schedule ratio | sd between processes |")
    print("|---|---|---|---|")
    for mode, s in summary.items():
        print(f"| {mode} | {s['sd_within']:.3f} | {s['sd_pair']:.3f} | {s['sd_between']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
