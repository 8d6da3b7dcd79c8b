"""How much one trial's time varies, timed plain and paired with the default schedule.

Makes BENCHMARKS.md's table "Measurement noise: plain and paired timing". A paired trial (`tune --timing
paired`) alternates every run with a run of the default schedule, so that a drift of the machine common to
both cancels. For one workload: the default schedule and the --schedules fastest of --schedules-from (a
tuning_curves_retimed.csv), in --workers fresh measurement processes per timing, --rounds interleaved rounds
each; the standard deviations of log time within a process (a schedule over its rounds), of a two-schedule
ratio in one round (the tuner's comparison) and between processes (a schedule's per-process median). Writes
timing_noise_<model>_<dataset>.csv (every trial) and .json (the summary) to --out.

Examples::

    python experiments/timing_noise.py --model hgt --dataset aifb --workers 3 --rounds 5
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from rgtune.tuner import MeasureOptions, Workload
from rgtune.tuner.measure import TIMINGS

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402 - experiments/ is not a package

RESULTS = _common.RESULTS / "timing_noise"
_REPO = RESULTS.parents[2]


def _shown(value: object) -> str:
    """A setting as the results record it: a path inside the repository relative to it, another path by
    its name only (results must not carry this machine's paths)."""
    if isinstance(value, Path):
        path = value.resolve()
        return str(path.relative_to(_REPO)) if path.is_relative_to(_REPO) else path.name
    return str(value)


def summarize(log_ms: Mapping[str, Mapping[str, np.ndarray]]) -> dict[str, dict[str, float]]:
    """Per timing mode: ``log_ms[mode][schedule]`` is a (processes x rounds) array of log times."""
    out = {}
    for mode, by_schedule in log_ms.items():
        names = sorted(by_schedule)
        pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
        out[mode] = {"sd_within": float(np.mean([by_schedule[n].std(axis=1).mean() for n in names])),
                     "sd_pair": float(np.mean([(by_schedule[a] - by_schedule[b]).std(axis=1).mean() for a, b in pairs])
                                      if pairs else np.nan),
                     "sd_between": float(np.mean([np.median(by_schedule[n], axis=1).std() for n in names]))}
    return out


def main(argv: list[str] | None = None) -> int:
    p = _common.parser(__doc__, "hidden", "data-dir", "out", out=RESULTS)
    p.add_argument("--model", default="hgt", choices=("rgcn", "rgat", "hgt"), help="the layer (default hgt)")
    p.add_argument("--dataset", default="aifb", help="default aifb")
    p.add_argument("--schedules", type=int, default=3, help="schedules besides the default (default 3)")
    p.add_argument("--schedules-from", type=Path, default=RESULTS / "schedules.csv",
                   help="a tuning_curves_retimed.csv (default: the seed-23 curves' near-ties, timing_noise/schedules.csv)")
    p.add_argument("--workers", type=int, default=3, help="measurement processes per timing (default 3)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds per process (default 5)")
    args = p.parse_args(argv)
    if args.workers < 2 or args.rounds < 2 or args.schedules < 1:
        p.error("--workers and --rounds must be >= 2 and --schedules >= 1 (a spread needs two of each)")
    fast = sorted((r for r in _common.read_csv(args.schedules_from)
                   if (r["model"], r["dataset"]) == (args.model, args.dataset) and r["retimed_ms"]),
                  key=lambda r: float(r["retimed_ms"]))
    if not fast:
        p.exit(1, f"timing_noise: no re-timed {args.model} {args.dataset} schedule in {args.schedules_from}\n")
    schedules = {"default": {}, **{f"fast{i}": json.loads(r["knobs"]) for i, r in enumerate(fast[:args.schedules])}}
    workload = Workload(args.model, args.dataset, args.hidden, args.hidden, 1, "cpu", args.data_dir)
    rows: list[dict[str, Any]] = []
    log_ms: dict[str, dict[str, list[list[float]]]] = {mode: {n: [] for n in schedules} for mode in TIMINGS}
    t0 = time.perf_counter()
    for process in range(args.workers):
        for mode in TIMINGS:
            for name, times in _common.rounds_ms(workload, schedules, args.rounds, MeasureOptions(timing=mode)).items():
                if any(t is None for t in times):
                    p.exit(1, f"timing_noise: schedule {name} failed in a {mode} round: {schedules[name]}\n")
                log_ms[mode][name].append([float(np.log(t)) for t in times])
                rows += [{"timing": mode, "process": process, "schedule": name, "round": r, "ms": t}
                         for r, t in enumerate(times)]
            print(f"process {process + 1}/{args.workers} {mode}: {time.perf_counter() - t0:.0f} s", flush=True)
    summary = summarize({m: {n: np.array(v) for n, v in d.items()} for m, d in log_ms.items()})
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"timing_noise_{args.model}_{args.dataset}"
    _common.write_csv(Path(f"{stem}.csv"), rows)
    settings = {k: _shown(v) for k, v in vars(args).items() if k != "data_dir"}  # no paths of this machine
    Path(f"{stem}.json").write_text(json.dumps({"settings": settings, "schedules": schedules, "summary": summary},
                                               indent=1))
    print("| timing | sd within a process | sd of a two-schedule ratio | sd between processes |\n|---|---|---|---|")
    for mode, s in summary.items():
        print(f"| {mode} | {s['sd_within']:.3f} | {s['sd_pair']:.3f} | {s['sd_between']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
