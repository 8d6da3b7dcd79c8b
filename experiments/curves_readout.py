"""The read-out of a tuning-curves run, as the pre-registrations fix it: the goal per workload and arm,
arms against each other, and each arm's re-timed incumbent after N measured trials.

It reads the files ``tuning_curves.py`` wrote (``--out``): ``tuning_curves_summary.json``,
``tuning_curves.csv`` and ``tuning_curves_retimed.csv``; it measures nothing. Every number is
re-timed quality (the incumbent's re-timed time, its measured time where it was not re-timed,
over the workload's fastest re-timed schedule), median over the run's seeds.

The goal (issue 7): an arm meets it on a workload when its median measured trials to within
5% of the best are at most half of the baseline's (``--baseline``, TPE alone) and its median
seconds to get there are fewer. Where the baseline's median does not get there within the budget,
the arm meets it if its median does within half the budget (half of more than the budget), the
workload is *undecided* if the arm's median needs more than half, and *neither* if the arm's does
not get there either.

``--compare A:B`` (repeatable) sets one arm against another on median trials to the goal:
``lower`` where A's median is lower, ``higher``, ``same``, or ``neither`` where neither median
gets there within the budget. By default each of the rank policy's ablation arms present
(``tpe+rank0``, ``tpe+rank-local0``: every other arm named ``tpe+rank...``) is compared with ``tpe+rank``.

``--workdir`` (the run's ``--workdir``) adds the cost model's counts summed over each arm's runs
(pools, local candidates, which kind was measured, refits), from the runs' traces.

Examples::

    python experiments/curves_readout.py experiments/results/tuning_curves_local
    python experiments/curves_readout.py experiments/results/tuning_curves_ablation_local \\
        --workdir curves_ablation_local --after 2,5,10,20,30
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any, Collection, Iterable, Mapping, NamedTuple, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling script, run or loaded by the tests
from tuning_curves import (  # noqa: E402  (one definition of arms, of what a run returns, of the best)
    BEST_ESTIMATES,
    arm_parts,
    best_relative,
    best_retimed,
    incumbent_times,
    retimed_scale,
)

WorkloadKey = tuple[str, str]  # (model, dataset)
COUNTS = ("pools", "local", "local_picked", "explored", "deferred", "refits")


# ---------------------------------------------------------------------- the rules
def verdict(base_trials: float, base_seconds: float, arm_trials: float, arm_seconds: float, budget: int) -> str:
    """``met``, ``missed``, ``undecided`` or ``neither``: the goal of one arm against the baseline on one
    workload, from the two medians of trials and of seconds to the goal (inf: not within the budget).

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


def compare(a_trials: float, b_trials: float) -> str:
    """``lower``, ``higher``, ``same`` or ``neither``: A's median trials to the goal against B's.

    >>> compare(2, 17), compare(math.inf, 30), compare(math.inf, math.inf)
    ('lower', 'higher', 'neither')
    """
    if math.isinf(a_trials) and math.isinf(b_trials):
        return "neither"
    return "lower" if a_trials < b_trials else ("higher" if a_trials > b_trials else "same")


# ---------------------------------------------------------------------- reading the run
class Summary(NamedTuple):
    """What ``tuning_curves_summary.json`` says: the rows with seeds, by (model, dataset, arm), the
    run's budget, and how its best re-timed time was estimated (``min`` for a run from before
    ``--best``)."""

    rows: dict[tuple[str, str, str], dict[str, Any]]
    budget: int
    best: str


def load_summary(results: Path) -> Summary:
    """The run's :class:`Summary`."""
    data = json.loads((results / "tuning_curves_summary.json").read_text())
    rows = {(r["model"], r["dataset"], r["arm"]): r for r in data["summary"] if r["seeds"]}
    return Summary(rows, int(data["settings"]["budget"]), data["settings"].get("best", "min"))


def csv_schedule(entry: Mapping[str, Any]) -> str:
    """A :func:`load_traces` entry's schedule hash (the ``schedule`` argument of ``tuning_curves``'s
    functions, which take a trace entry's knobs by default)."""
    return entry["schedule_hash"]


class Retimed(NamedTuple):
    """What ``tuning_curves_retimed.csv`` says, per workload (see :func:`load_retimed`)."""

    times: dict[WorkloadKey, dict[str, float]]
    scales: dict[str, dict[WorkloadKey, float]]
    bests: dict[str, dict[WorkloadKey, float]]


def load_retimed(results: Path, traces: Mapping[tuple[str, str, str, str], Sequence[Mapping[str, Any]]]) -> Retimed:
    """Per workload: the re-timed ms of each schedule that has one (``times``); two
    ``tuning_curves.retimed_scale`` by what they scale (``scales``): ``relative``, of the re-timed
    schedules' times relative to their runs' default schedule (``traces``: :func:`load_traces`), and
    ``measured``, of their absolute measured times (the scale of the first correction of 2026-11-25);
    and the best re-timed time by each of ``tuning_curves.BEST_ESTIMATES`` (``bests``; ``crossfit``
    only where the CSV has each round's time)."""
    out: dict[WorkloadKey, dict[str, float]] = {}
    measured: dict[WorkloadKey, dict[str, float]] = {}
    schedules: dict[WorkloadKey, dict[str, dict[str, Any]]] = {}
    with open(results / "tuning_curves_retimed.csv", newline="") as f:
        reader = csv.DictReader(f)
        round_columns = sorted((c for c in reader.fieldnames or () if _round_index(c) >= 0), key=_round_index)
        for r in reader:
            if r["retimed_ms"]:
                key = (r["model"], r["dataset"])
                out.setdefault(key, {})[r["schedule_hash"]] = float(r["retimed_ms"])
                measured.setdefault(key, {})[r["schedule_hash"]] = float(r["measured_ms"])
            schedules.setdefault((r["model"], r["dataset"]), {})[r["schedule_hash"]] = {
                "retimed_ms": float(r["retimed_ms"]) if r["retimed_ms"] else None,
                "rounds_ms": [float(r[c]) if r[c] else None for c in round_columns]}
    by_workload: dict[WorkloadKey, list[Sequence[Mapping[str, Any]]]] = {}
    for (model, dataset, _, _), trace in traces.items():
        by_workload.setdefault((model, dataset), []).append(trace)
    relative = {key: best_relative(by_workload.get(key, []), schedule=csv_schedule) for key in out}
    bests: dict[str, dict[WorkloadKey, float]] = {how: {} for how in BEST_ESTIMATES}
    for key in out:
        for how in BEST_ESTIMATES:
            with contextlib.suppress(ValueError):  # crossfit: a CSV without each round's time
                bests[how][key] = best_retimed(schedules[key], how)
    return Retimed(out, {kind: {key: retimed_scale((times[key][h], ms) for h, ms in out[key].items()) for key in out}
                         for kind, times in (("relative", relative), ("measured", measured))}, bests)


def _round_index(column: str) -> int:
    """``round3_ms`` -> 3; -1 for a column that is not a round's."""
    name = column.removeprefix("round").removesuffix("_ms")
    return int(name) if column.startswith("round") and name.isdigit() else -1


def run_bests(retimed: Retimed, how: str) -> dict[WorkloadKey, float]:
    """The best re-timed time of each workload by ``how``, or a ValueError naming what is missing."""
    bests = retimed.bests[how]
    missing = sorted(set(retimed.times) - set(bests))
    if missing:
        raise ValueError(f"best estimate {how!r} needs each re-timing round's time, which "
                         f"tuning_curves_retimed.csv lacks for {', '.join(' '.join(k) for k in missing)}")
    return bests


def load_traces(results: Path) -> dict[tuple[str, str, str, str], list[dict[str, Any]]]:
    """Each run's trace in ``tuning_curves.csv``, by (model, dataset, arm, seed): the fields as
    written, ``ms`` as a float (None where the trial was not ok)."""
    traces: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    with open(results / "tuning_curves.csv", newline="") as f:
        for r in csv.DictReader(f):
            entry = {**r, "ms": float(r["ms"]) if r["ms"] else None}
            traces.setdefault((r["model"], r["dataset"], r["arm"], r["seed"]), []).append(entry)
    return traces


Traces = Mapping[tuple[str, str, str, str], Sequence[Mapping[str, Any]]]


def quality_after(results: Path, after: Sequence[int], traces: Traces | None = None, best_estimate: str = "min"
                  ) -> dict[tuple[str, str, str], list[float]]:
    """Per (model, dataset, arm): the median over seeds of the incumbent's quality after each of
    ``after`` measured trials (what the run would return then: its lowest measured time so far,
    as ``tuning_curves.incumbent_times`` follows it), over the best re-timed time by ``best_estimate``
    (``tuning_curves.best_retimed``). ``traces``: :func:`load_traces`' (read when None)."""
    traces = load_traces(results) if traces is None else traces
    retimed = load_retimed(results, traces)
    best = run_bests(retimed, best_estimate)
    per_seed: dict[tuple[str, str, str], list[dict[int, float]]] = {}
    for (model, dataset, arm, _), trace in traces.items():
        if (model, dataset) not in best:
            continue  # not re-timed: no scale to judge it on
        times = incumbent_times(trace, retimed.times[(model, dataset)], schedule=csv_schedule,
                                scale=retimed.scales["relative"][(model, dataset)])
        quality = {int(t["measured"]): ms / best[(model, dataset)] for t, ms in zip(trace, times) if ms is not None}
        per_seed.setdefault((model, dataset, arm), []).append(quality)
    return {key: [statistics.median(q.get(n, math.inf) for q in seeds) for n in after]
            for key, seeds in per_seed.items()}


def rechecked(results: Path, traces: Traces | None = None) -> dict[tuple[str, str, str], tuple[float, float]]:
    """Per (model, dataset, arm), medians over seeds of: the trials measured more than once (the
    tuner's recheck of a new best), and the share of the run's seconds those extra measurements
    took (a rechecked trial's seconds less the median seconds of the run's trials measured once;
    the first trial is left out: its seconds include the setup). Empty for a run from before the
    ``measurements`` column. ``traces``: :func:`load_traces`' (read when None)."""
    traces = load_traces(results) if traces is None else traces
    if any(t.get("measurements") is None for trace in traces.values() for t in trace):
        return {}
    out: dict[tuple[str, str, str], list[tuple[int, float]]] = {}
    for (model, dataset, arm, _), trace in traces.items():
        wall = [float(t["wall_s"]) for t in trace]
        seconds = [b - a for a, b in zip(wall, wall[1:])]
        again = [int(t["measurements"]) > 1 for t in trace[1:]]
        once = [s for s, a in zip(seconds, again) if not a]
        typical = statistics.median(once) if once else 0.0
        extra = sum(max(0.0, s - typical) for s, a in zip(seconds, again) if a)
        out.setdefault((model, dataset, arm), []).append(
            (sum(int(t["measurements"]) > 1 for t in trace), extra / wall[-1] if wall[-1] > 0 else 0.0))
    return {key: (statistics.median(n for n, _ in v), statistics.median(x for _, x in v)) for key, v in out.items()}


def counts(workdir: Path, runs: Collection[tuple[str, str, str, str]] | None = None
           ) -> dict[tuple[str, str, str], dict[str, int]]:
    """The cost model's counts, summed over each arm's runs (arms without a model are left out).

    ``runs`` (``(model, dataset, arm, seed)`` keys, as :func:`load_traces` gives them) keeps only
    those: a work directory shared by several commands holds runs that are not in this read-out.
    """
    out: dict[tuple[str, str, str], dict[str, int]] = {}
    for path in sorted(workdir.glob("runs/*/trace.json")):
        run = json.loads(path.read_text())
        key = (run["model"], run["dataset"], run["arm"], str(run["seed"]))
        if not run.get("cost_model") or (runs is not None and key not in runs):
            continue
        total = out.setdefault(key[:3], {})
        for k, v in run["cost_model"].get("counts", {}).items():
            total[k] = total.get(k, 0) + int(v)
    return out


# ---------------------------------------------------------------------- the report
def _trials(x: float) -> str:
    return f"{x:g}" if math.isfinite(x) else "> budget"


def _seconds(x: float) -> str:
    return f"{x:.1f}" if math.isfinite(x) else "—"


def _seeds(xs: Iterable[float]) -> str:
    return ", ".join(_trials(x) for x in sorted(xs))


def report(results: Path, baseline: str = "tpe", pairs: Sequence[tuple[str, str]] | None = None,
           after: Sequence[int] = (2, 5, 10, 20, 30), workdir: Path | None = None) -> list[str]:
    """The read-out as lines of Markdown."""
    rows, budget, best = load_summary(results)
    workloads = sorted({(m, d) for m, d, _ in rows})
    present = list(dict.fromkeys(a for _, _, a in rows))
    unknown = [a for a in (baseline, *(x for pair in pairs or () for x in pair)) if a not in present]
    if unknown:
        raise ValueError(f"arm(s) {', '.join(map(repr, dict.fromkeys(unknown)))} not in this run; "
                         f"its arms: {', '.join(present)}")
    arms = [a for a in present if a != baseline]
    scored = "" if best == "min" else f"; best re-timed time: {best}"  # read-outs before --best unchanged
    lines = [f"## Goal against {baseline} (budget {budget}; re-timed medians over seeds{scored})", "",
             "| model | dataset | arm | trials to goal: base / arm | seconds to goal: base / arm | "
             "seeds reaching it: base / arm | trials per seed | verdict |", "|---|---|---|---|---|---|---|---|"]
    tally: dict[str, list[str]] = {}
    for model, dataset in workloads:
        base = rows.get((model, dataset, baseline))
        for arm in arms:
            row = rows.get((model, dataset, arm))
            if base is None or row is None:
                continue
            v = verdict(base["retimed_median_trials_to_goal"], base["retimed_median_seconds_to_goal"],
                        row["retimed_median_trials_to_goal"], row["retimed_median_seconds_to_goal"], budget)
            tally.setdefault(arm, []).append(v)
            trials = (f"{_trials(base['retimed_median_trials_to_goal'])} / "
                      f"{_trials(row['retimed_median_trials_to_goal'])}")
            seconds = (f"{_seconds(base['retimed_median_seconds_to_goal'])} / "
                       f"{_seconds(row['retimed_median_seconds_to_goal'])}")
            lines.append(f"| {model} | {dataset} | {arm} | {trials} | {seconds} | {base['retimed_reached']} / "
                         f"{row['retimed_reached']} | {_seeds(row['retimed_trials_to_goal'])} | {v} |")
    lines += ["", *(f"- {arm}: met on {v.count('met')} of {len(v)}" for arm, v in tally.items())]
    if pairs is None:
        pairs = [(b, a) for a in arms if (b := _ablated(a)) is not None and b in (baseline, *arms)]
    for a, b in pairs:
        lines += ["", f"## {a} against {b}: median trials to the goal", "",
                  f"| model | dataset | {a} | {b} | {a} is |", "|---|---|---|---|---|"]
        outcome = []
        for model, dataset in workloads:
            ra, rb = rows.get((model, dataset, a)), rows.get((model, dataset, b))
            if ra is None or rb is None:
                continue
            c = compare(ra["retimed_median_trials_to_goal"], rb["retimed_median_trials_to_goal"])
            outcome.append(c)
            lines.append(f"| {model} | {dataset} | {_trials(ra['retimed_median_trials_to_goal'])} | "
                         f"{_trials(rb['retimed_median_trials_to_goal'])} | {c} |")
        lines += ["", f"- lower on {outcome.count('lower')}, higher on {outcome.count('higher')}, the same on "
                      f"{outcome.count('same')}, neither gets there on {outcome.count('neither')}"]
    traces = load_traces(results)
    quality, again = quality_after(results, after, traces, best), rechecked(results, traces)
    extra = " rechecked per run | share of seconds |" if again else ""
    lines += ["", f"## Re-timed incumbent over the best{'' if best == 'min' else f' ({best})'}, after N measured "
                  "trials", "",
              "| model | dataset | arm | " + " | ".join(f"after {n}" for n in after) + " | seconds per run |" + extra,
              "|---|---|---|" + "---|" * (len(after) + 1 + 2 * bool(again))]
    for model, dataset in workloads:
        for arm in (baseline, *arms):
            q, row = quality.get((model, dataset, arm)), rows.get((model, dataset, arm))
            if q is not None and row is not None:
                lines.append(f"| {model} | {dataset} | {arm} | " + " | ".join(f"{x:.2f}" for x in q)
                             + f" | {row['median_wall_s']:.0f} |"
                             + (" {:g} | {:.0%} |".format(*again.get((model, dataset, arm), (0, 0.0)))
                                if again else ""))
    if workdir is not None:
        lines += ["", "## The cost model's counts, summed over seeds", "",
                  "| model | dataset | arm | " + " | ".join(COUNTS) + " |", "|---|---|---|" + "---|" * len(COUNTS)]
        for (model, dataset, arm), c in sorted(counts(workdir, traces.keys()).items()):
            lines.append(f"| {model} | {dataset} | {arm} | " + " | ".join(str(c.get(k, 0)) for k in COUNTS) + " |")
    return lines


def _ablated(arm: str) -> str | None:
    """The arm an ablation arm is compared with by default: a recheck variant's base arm
    (``tpe/recheck=1``: ``tpe``), else ``tpe+rank`` for a rank ablation (``tpe+rank-local0``); None
    for an arm that is not an ablation.

    Example:
        >>> _ablated("tpe+rank/recheck=1"), _ablated("tpe/recheck=1"), _ablated("tpe+rank0"), _ablated("tpe")
        ('tpe+rank', 'tpe', 'tpe+rank', None)
    """
    base, recheck = arm_parts(arm)
    if recheck is not None:
        return base
    return "tpe+rank" if arm.startswith("tpe+rank") and arm != "tpe+rank" else None


def _pair(text: str) -> tuple[str, str]:
    a, sep, b = text.partition(":")
    if not sep or not a or not b:
        raise argparse.ArgumentTypeError(f"--compare takes ARM:ARM (e.g. tpe+rank:tpe+rank-local0), not {text!r}")
    return a, b


def _after(text: str) -> list[int]:
    try:
        ns = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        ns = []
    if not ns or min(ns) < 1:
        raise argparse.ArgumentTypeError(f"--after takes positive trial counts, comma-separated, not {text!r}")
    return ns


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path, help="a tuning_curves.py --out folder")
    p.add_argument("--baseline", default="tpe", help="the arm the goal is judged against (default tpe)")
    p.add_argument("--compare", type=_pair, action="append", default=None, metavar="A:B",
                   help="compare arm A with arm B (repeatable; default: each ablation arm present with tpe+rank)")
    p.add_argument("--after", type=_after, default=[2, 5, 10, 20, 30],
                   help="measured trials at which to report the incumbent (default 2,5,10,20,30)")
    p.add_argument("--workdir", type=Path, default=None, help="the run's --workdir: adds the cost model's counts")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    summary = args.results / "tuning_curves_summary.json"
    if not summary.is_file():
        print(f"curves_readout: {summary} not found: give the --out folder of a finished tuning_curves.py run",
              file=sys.stderr)
        return 2
    if args.workdir is not None and not (args.workdir / "runs").is_dir():
        print(f"curves_readout: {args.workdir} has no runs/ folder: give the run's --workdir", file=sys.stderr)
        return 2
    try:
        lines = report(args.results, args.baseline, args.compare, args.after, args.workdir)
    except ValueError as e:
        print(f"curves_readout: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
