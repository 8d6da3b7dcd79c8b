"""The read-out of a tuning-curves run (``experiments/tuning_curves.py``), on a run written here."""

from __future__ import annotations

import csv
import doctest
import json
import math
from pathlib import Path
from types import ModuleType

import pytest

INF = math.inf


def _summary_row(model: str, dataset: str, arm: str, trials: list[float], seconds: list[float]) -> dict:
    med = sorted(trials)[len(trials) // 2]
    return {"model": model, "dataset": dataset, "arm": arm, "seeds": len(trials), "median_wall_s": 50.0,
            "retimed_median_trials_to_goal": med, "retimed_median_seconds_to_goal": sorted(seconds)[len(seconds) // 2],
            "retimed_reached": sum(math.isfinite(t) for t in trials), "retimed_trials_to_goal": trials}


def _write_run(out: Path, traces: dict[tuple[str, str, str, int], list[tuple]],
               retimed: dict[str, float | tuple[float, float]], rows: list[dict],
               rounds: dict[str, list[float | None]] | None = None, best: str | None = None) -> None:
    """A results folder as tuning_curves.py writes it: traces of (schedule, measured ms) per run, or of
    (schedule, measured ms, measurements, wall seconds) as written since the tuner's recheck;
    ``retimed``: a schedule's re-timed ms, or its (fastest measured ms, re-timed ms); ``rounds``: each
    re-timed schedule's time per round (no round columns when None, as before the round columns were
    read); ``best``: the run's ``--best`` (not recorded when None, as before it existed)."""
    out.mkdir()
    settings = {"budget": 100} | ({"best": best} if best else {})
    (out / "tuning_curves_summary.json").write_text(json.dumps({"settings": settings, "summary": rows}))
    rechecked = any(len(e) == 4 for trace in traces.values() for e in trace)
    with open(out / "tuning_curves.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "dataset", "seed", "arm", "proposal", "measured", "status", "ms", "best_ms",
                    "predicted_ms", "wall_s", "schedule_hash"] + ["measurements"] * rechecked)
        for (model, dataset, arm, seed), trace in traces.items():
            for i, (h, ms, *more) in enumerate(trace, 1):
                measurements, wall = more or (1, i)
                w.writerow([model, dataset, seed, arm, i, i, "ok", ms, "", "", wall, h]
                           + [measurements] * rechecked)
    with open(out / "tuning_curves_retimed.csv", "w", newline="") as f:
        w = csv.writer(f)
        n_rounds = max((len(r) for r in (rounds or {}).values()), default=0)
        w.writerow(["model", "dataset", "schedule_hash", "knobs", "measured_ms", "retimed_ms",
                    *(f"round{i}_ms" for i in range(n_rounds))])
        for h, ms in retimed.items():
            measured, again = ms if isinstance(ms, tuple) else (ms, ms)
            w.writerow(["hgt", "aifb", h, "{}", measured, again,
                        *("" if t is None else t for t in (rounds or {}).get(h, []))])


@pytest.fixture
def readout(load_experiment) -> ModuleType:
    return load_experiment("tuning_curves")


def test_readout_examples_hold(readout):
    assert doctest.testmod(readout).failed == 0


@pytest.mark.parametrize(("base", "arm", "expected"), [
    ((28, 18.0), (14, 17.0), "met"),  # exactly half the trials and fewer seconds
    ((28, 18.0), (14, 18.0), "missed"),  # half the trials, not less time
    ((28, 18.0), (15, 5.0), "missed"),  # more than half the trials
    ((INF, INF), (50, 40.0), "met"),  # the baseline not within 100: at most half of the budget
    ((INF, INF), (51, 40.0), "undecided"),
    ((INF, INF), (INF, INF), "neither"),
    ((30, 20.0), (INF, INF), "missed"),
])
def test_the_goal_rule_is_the_preregistered_one(readout, base, arm, expected):
    assert readout.verdict(*base, *arm, budget=100) == expected


def test_report_judges_each_arm_and_follows_the_incumbent(readout, tmp_path):
    rows = [_summary_row("hgt", "aifb", "tpe", [10, 30, INF], [5, 20, INF]),
            _summary_row("hgt", "aifb", "tpe+rank", [2, 3, 40], [1, 2, 30]),
            _summary_row("hgt", "aifb", "tpe+rank-local0", [4, 20, INF], [2, 15, INF])]
    # the incumbent is the lowest *measured* time; its quality is its *re-timed* time over the best
    traces = {("hgt", "aifb", "tpe", 1): [("a", 10.0), ("b", 8.0), ("c", 9.0)],
              ("hgt", "aifb", "tpe+rank", 1): [("a", 10.0), ("c", 7.0), ("b", 7.5)],
              ("hgt", "aifb", "tpe+rank-local0", 1): [("a", 10.0), ("d", 7.0), ("c", 6.0)]}
    retimed = {"a": 10.0, "b": 5.0, "c": 6.0}
    _write_run(tmp_path / "run", traces, retimed, rows)
    quality = readout.quality_after(tmp_path / "run", [1, 2, 3])
    assert quality[("hgt", "aifb", "tpe")] == [2.0, 1.0, 1.0]
    assert quality[("hgt", "aifb", "tpe+rank")] == [2.0, 1.2, 1.2]  # b measured slower than c: c stays
    # d was not re-timed: 0.7 of its run's default, on the scale of the fastest relative time (c's
    # 0.6) to the best re-timed one (5 ms)
    assert quality[("hgt", "aifb", "tpe+rank-local0")] == [2.0, pytest.approx(0.7 / 0.6), 1.2]
    text = "\n".join(readout.report(tmp_path / "run", after=[1, 3]))
    assert "| hgt | aifb | tpe+rank | 30 / 3 | 20.0 / 2.0 | 2 / 3 | 2, 3, 40 | met |" in text
    assert "| hgt | aifb | tpe+rank-local0 | 30 / 20 | 20.0 / 15.0 | 2 / 2 | 4, 20, > budget | missed |" in text
    assert "- tpe+rank: met on 1 of 1" in text and "- tpe+rank-local0: met on 0 of 1" in text
    assert "| hgt | aifb | tpe+rank | 2.00 | 1.20 | 50 |" in text


def test_an_incumbent_not_re_timed_is_put_on_the_re_timing_scale(readout, tmp_path):
    # the machine ran 1.75x slower while re-timing: b, measured 1.5x slower than a (outside the
    # re-timing window, so not re-timed), must not count as 0.86x the best re-timed time
    rows = [_summary_row("hgt", "aifb", "tpe", [2], [2])]
    traces = {("hgt", "aifb", "tpe", 1): [("b", 12.0), ("a", 8.0)]}
    _write_run(tmp_path / "run", traces, {"a": (8.0, 14.0)}, rows)
    assert readout.quality_after(tmp_path / "run", [1, 2])[("hgt", "aifb", "tpe")] == [1.5, 1.0]


def test_an_incumbent_of_a_run_measured_in_a_slow_process_is_judged_against_its_run(readout, tmp_path):
    # run 2's process measured everything 1.6x slower (its default: 16 ms, not 10): x, as fast as a
    # relative to the default and not re-timed, is as close to the best as a is, not 1.6x off
    rows = [_summary_row("hgt", "aifb", "tpe", [2, 2], [2, 2])]
    traces = {("hgt", "aifb", "tpe", 1): [("d", 10.0), ("a", 5.0)],
              ("hgt", "aifb", "tpe", 2): [("d", 16.0), ("x", 8.0)]}
    _write_run(tmp_path / "run", traces, {"a": 5.0}, rows)
    assert readout.quality_after(tmp_path / "run", [1, 2])[("hgt", "aifb", "tpe")] == [2.0, 1.0]


def test_re_timing_window_compares_each_incumbent_with_its_own_runs_default(load_experiment):
    curves = load_experiment("tuning_curves")

    def entry(tile: int, ms: float) -> dict:
        return {"status": "ok", "ms": ms, "knobs": {"tile": tile}}

    runs = [{"model": "hgt", "dataset": "aifb", "trace": [entry(1, 10.0), entry(2, 5.0)]},
            # a slow process: x (tile 3) is as fast as tile 2 relative to the default; tile 4 is not
            {"model": "hgt", "dataset": "aifb", "trace": [entry(1, 16.0), entry(4, 11.0), entry(3, 8.0)]}]
    chosen = curves.incumbents(runs, 0.25)[("hgt", "aifb")]
    assert sorted(v["knobs"]["tile"] for v in chosen.values()) == [2, 3]
    assert sorted((v["measured_ms"], v["relative"]) for v in chosen.values()) == [(5.0, 0.5), (8.0, 0.5)]


def test_readout_says_what_is_missing(readout, tmp_path, capsys):
    assert readout.main(["--readout", str(tmp_path)]) == 2
    assert "tuning_curves_summary.json" in capsys.readouterr().err


def test_crossfit_best_is_free_of_the_winners_curse(load_experiment):
    curves = load_experiment("tuning_curves")
    # twenty equal schedules, each measured in 6 rounds with noise: the lowest median is biased low,
    # the schedule fastest over half the rounds is not so fast over the other half
    rng = __import__("random").Random(0)
    rounds = {f"s{i}": [1.0 + rng.gauss(0, 0.05) for _ in range(6)] for i in range(20)}
    medians = {h: sorted(r)[2] / 2 + sorted(r)[3] / 2 for h, r in rounds.items()}
    lowest = min(medians.values())
    crossfit = curves.crossfit_best(rounds)
    assert lowest < 0.97 < crossfit  # every schedule's true time is 1.0
    assert curves.best_retimed({h: {"retimed_ms": m, "rounds_ms": rounds[h]} for h, m in medians.items()},
                               "min") == lowest
    # a failed round leaves its half; a schedule without an ok round in a half does not compete
    assert curves.crossfit_best({"a": [1.0, None, 1.0, 2.0], "b": [None, 0.5, None, 0.5]}) == math.sqrt(1.0 * 2.0)
    with pytest.raises(ValueError, match="unknown best estimate 'max'; choose one of"):
        curves.best_retimed({}, "max")


def test_readout_scores_against_the_runs_best_estimate(readout, tmp_path):
    rows = [_summary_row("hgt", "aifb", "tpe", [2], [2])]
    # b has the lowest re-timed median (8.5) by its lucky even rounds; fastest over the even rounds,
    # it takes 10 over the odd ones, and a, fastest over the odd ones, 9 over the even ones: the
    # crossfit best is sqrt(10 * 9), and a (9.0) is within 5% of it, not of 8.5
    rounds = {"a": [9.0] * 4, "b": [7.0, 10.0, 7.0, 10.0], "d": [20.0] * 4}
    traces = {("hgt", "aifb", "tpe", 1): [("d", 20.0), ("a", 9.0)],
              ("hgt", "aifb", "tpe", 2): [("d", 20.0), ("b", 9.5)]}
    crossfit = math.sqrt(10.0 * 9.0)
    for best, by in (("min", 8.5), ("crossfit", crossfit)):
        _write_run(tmp_path / best, traces, {"a": 9.0, "b": 8.5, "d": 20.0}, rows, rounds, best)
        assert readout.quality_after(tmp_path / best, [1, 2], best_estimate=best)[("hgt", "aifb", "tpe")] == [
            pytest.approx(20.0 / by), pytest.approx((9.0 + 8.5) / 2 / by)]  # the median of the two seeds
    text = "\n".join(readout.report(tmp_path / "crossfit", after=[2]))
    assert "re-timed medians over seeds; best re-timed time: crossfit)" in text
    assert "## Re-timed incumbent over the best (crossfit), after N measured trials" in text
    assert "best re-timed time" not in "\n".join(readout.report(tmp_path / "min", after=[2]))
    # without round columns a crossfit read-out says what is missing
    _write_run(tmp_path / "old", traces, {"a": 9.0, "b": 8.5, "d": 20.0}, rows, None, "crossfit")
    with pytest.raises(ValueError, match="needs each re-timing round's time, which tuning_curves_retimed.csv lacks "
                                         "for hgt aifb"):
        readout.quality_after(tmp_path / "old", [1], best_estimate="crossfit")
