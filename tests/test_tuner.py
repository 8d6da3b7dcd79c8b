"""The tuning loop and its measurement worker: faults, resume after kill -9, the CLI's errors."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rgtune.db import TrialDatabase
from rgtune.db.trial_result import TrialResult
from rgtune.tuner.measure import MeasureOptions, MeasureWorker, measure_rounds, paired_times
from rgtune.tuner.study import TuneOptions, Tuner
from rgtune.tuner.workload import Workload

GRAPH = "synthetic:custom,nodes=300,edges=2500,ntypes=2,rels=4,seed=1"
FAST = MeasureOptions(warmup=1, repeats=2, min_seconds=0.0, timeout=20.0)
REPO = Path(__file__).resolve().parents[1]


def _workload(backend: str, model: str = "rgcn") -> Workload:
    return Workload(model, GRAPH, 8, 8, 1, backend)


@pytest.fixture
def db(tmp_path):
    return TrialDatabase(f"sqlite:///{tmp_path / 'results.db'}")


# ------------------------------------------------------------------ the worker alone
def test_a_correct_schedule_is_ok_and_timed():
    with MeasureWorker(_workload("reference"), FAST) as w:
        r = w.measure({}, seed=1)
    assert r.status == "ok" and r.median is not None and r.median > 0 and r.max_error < 1e-4
    assert len(r.times) >= 2


def test_paired_timing_cancels_a_drift_common_to_both_runs():
    import random
    import statistics

    rng = random.Random(3)
    now, speed = [0.0], [1.0]

    def run(cost: float) -> None:
        now[0] += cost * speed[0]
        if rng.random() < 0.3:  # the machine's speed jumps between runs, by up to 2x either way
            speed[0] = rng.uniform(0.5, 2.0)

    opts = MeasureOptions(warmup=2, repeats=15, min_seconds=0.0)
    ratios, plain = [], []
    for _ in range(5):
        c, r = paired_times(lambda: run(0.003), lambda: run(0.002), opts, clock=lambda: now[0])
        assert len(c) == len(r) == 15
        ratios.append(statistics.median(a / b for a, b in zip(c, r)))
        plain.append(statistics.median(c))
    # a drift between two runs of a pair moves single pairs, not their median, much
    assert max(ratios) / min(ratios) < 1.25 and abs(statistics.median(ratios) - 1.5) < 0.1
    assert max(plain) / min(plain) > 1.3  # the same drift, timed plain


def test_a_paired_trial_is_its_ratio_to_the_default_on_a_kept_scale():
    opts = MeasureOptions(warmup=1, repeats=3, min_seconds=0.0, timeout=20.0, timing="paired")
    with MeasureWorker(_workload("cpu"), opts) as w:
        r = w.measure({"layout.index_bits": 32}, seed=1)
        paired = r.details.paired
        assert r.status == "ok" and paired is not None and len(r.times) >= 3
        scale = paired.reference_ms
        assert scale > 0 and 0.02 < paired.vs_reference < 50
        assert r.median == pytest.approx(paired.vs_reference * scale / 1e3)
        assert w.options.reference_ms == scale  # a restarted worker times on this scale
        w._kill()
        r2 = w.measure({}, seed=2)
        assert r2.status == "ok" and r2.details.paired.reference_ms == scale and 0.5 < r2.details.paired.vs_reference < 2.0


def test_timing_options_are_checked():
    with pytest.raises(ValueError, match=r"unknown timing 'blocks'; choose one of \['plain', 'paired'\]"):
        MeasureOptions(timing="blocks")
    with pytest.raises(ValueError, match="reference_ms must be a positive"):
        MeasureOptions(timing="paired", reference_ms=0.0)


def test_paired_timing_refuses_a_backend_timed_on_the_device(monkeypatch):
    from rgtune.tuner import measure

    class EventTimed:
        times_on_device = True

        def time_runs(self, *args):
            return [1.0]

    session = object.__new__(measure._Session)
    session.backend, session.w = EventTimed(), _workload("cuda")
    with pytest.raises(ValueError, match="paired timing alternates host-timed runs; backend 'cuda'"):
        session._start_reference()


def test_a_hanging_kernel_is_a_timeout_and_the_worker_comes_back():
    opts = MeasureOptions(warmup=1, repeats=2, min_seconds=0.0, timeout=3.0)
    with MeasureWorker(_workload("_faulty_backends:Hang"), opts) as w:
        t = time.time()
        r = w.measure({}, seed=0)
        assert r.status == "timeout" and time.time() - t < 30
        os.environ["RGTUNE_FAULT_KNOB"] = "layout.index_bits=64"  # the next worker hangs only on 64-bit
        try:
            assert w.measure({}, seed=1).status == "ok"
        finally:
            del os.environ["RGTUNE_FAULT_KNOB"]


def test_a_segfault_is_a_runtime_error_and_the_worker_restarts():
    with MeasureWorker(_workload("_faulty_backends:Segfault"), FAST) as w:
        r = w.measure({}, seed=0)
        assert r.status == "runtime_error" and "SIGSEGV" in (r.error or "")
        r2 = w.measure({}, seed=1)
        assert r2.status == "runtime_error" and w.restarts == 1


def test_a_wrong_kernel_is_a_wrong_result_with_its_error():
    with MeasureWorker(_workload("_faulty_backends:Wrong"), FAST) as w:
        r = w.measure({}, seed=0)
    assert r.status == "wrong_result" and r.max_error > 1e-4 and "relative error" in r.error
    assert r.median is None  # never timed


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_a_trial_times_its_kernels_and_the_layer_as_called_and_the_objective_picks_one(mode):
    from rgtune.tuner.measure import _Session

    w = replace(_workload("reference"), mode=mode)
    kernels = _Session(w, FAST).measure({}, seed=0)
    d = kernels.details
    assert kernels.status == "ok" and d.objective == "kernels" and d.kernel_ms > 0 and d.call_ms > 0
    assert kernels.median * 1e3 == pytest.approx(d.kernel_ms) and d.call_warnings == []
    called = _Session(w, replace(FAST, objective="call")).measure({}, seed=0)
    assert called.status == "ok" and called.details.objective == "call"
    assert called.median * 1e3 == pytest.approx(called.details.call_ms) and called.details.kernel_ms > 0


def test_a_call_that_computes_other_than_its_kernels_is_a_wrong_result_never_timed(monkeypatch):
    from rgtune.tuner import call
    from rgtune.tuner.measure import _Session

    right = call.LayerCall.results

    def off(self, *args):
        got = right(self, *args)
        return {**got, "input gradient": got["input gradient"] + 0.5}

    monkeypatch.setattr(call.LayerCall, "results", off)
    r = _Session(replace(_workload("reference"), mode="training"), FAST).measure({}, seed=0)
    assert r.status == "wrong_result" and r.median is None and r.max_error > 1e-3
    assert r.error.startswith("the layer as called (its kernels verified): relative error") and "input gradient" in r.error
    assert r.details.call_ms is None and r.details.kernel_ms > 0


def test_a_reverification_checks_the_layer_as_called_too(monkeypatch):
    """The best schedule's check on fresh inputs runs its kernels and then the layer as a user calls it: a call
    off the reference on one of them is a ``wrong_result`` that says so and names the input."""
    from rgtune.tuner import call
    from rgtune.tuner.measure import _Session

    session = _Session(replace(_workload("reference"), mode="training"), FAST)
    ok = session.reverify({}, seeds=[11, 12], runs=2)
    assert ok.status == "ok" and ok.details.fresh_inputs == [11, 12] and ok.max_error < 1e-4
    calls = []
    right = call.LayerCall.results

    def off_on_the_second(self, *args):
        calls.append(1)
        got = right(self, *args)
        return got if len(calls) < 3 else {**got, "output": got["output"] + 0.5}

    monkeypatch.setattr(call.LayerCall, "results", off_on_the_second)
    r = session.reverify({}, seeds=[11, 12], runs=2)
    assert r.status == "wrong_result" and r.max_error > 1e-3 and len(calls) == 3
    assert r.error.startswith("the layer as called (its kernels verified): relative error") and "output" in r.error
    assert r.error.endswith("on fresh input 12 (run 1 of 2)")
    # a sampled verifier reuses its input tensors from one case to the next: each pass makes its own
    monkeypatch.setattr(call.LayerCall, "results", right)
    sampled = _Session(replace(_workload("reference"), mode="training"), replace(FAST, verify="sampled", verify_rows=8))
    assert sampled.verifier.sampled
    ok = sampled.reverify({}, seeds=[11, 12, 13], runs=1)
    assert ok.status == "ok" and ok.max_error < 1e-4, ok.error


def test_the_objective_is_checked_and_the_call_is_not_paired():
    from rgtune.tuner.measure import _Session

    with pytest.raises(ValueError, match=r"unknown objective 'layer'; choose one of \['auto', 'call', 'kernels'\]"):
        MeasureOptions(objective="layer")
    with pytest.raises(ValueError, match="objective 'call' times the layer as called on the whole graph"):
        _Session(_workload("reference"), replace(FAST, objective="call", timing="paired"))


def test_the_tolerance_follows_float32s_own_error_on_ill_conditioned_inputs():
    """A kernel may be as far off float64 as the float32 reference is (times a margin), never less
    strict than the base tolerance; the message says which tolerance a wrong result exceeded."""
    from rgtune.tuner.verification import FLOAT32_MARGIN, shown, tolerance

    exact = {"output": torch.tensor([1.0, 2.0], dtype=torch.float64),
             "gradient of w": torch.tensor([1.0, -1.0], dtype=torch.float64)}
    rounded = {"output": torch.tensor([1.0, 2.0]), "gradient of w": torch.tensor([1.0, -1.003])}
    tol = {name: tolerance(1e-4, exact[name], rounded[name], 10) for name in exact}
    assert tol["output"] == 1e-4 and tol["gradient of w"] == pytest.approx(FLOAT32_MARGIN * 3e-3, rel=1e-3)
    assert "the float32 reference's own error" in shown(tol["gradient of w"], 1e-4)
    assert shown(1e-4, 1e-4) == "0.0001"


def test_measure_rounds_times_every_schedule_in_every_round_and_only_ok_ones():
    configs = {"default": {}, "64-bit": {"layout.index_bits": 64}, "bad": {"layout.index_bits": 7}}
    seen: list[tuple[str, int, str]] = []
    times = measure_rounds(_workload("reference"), configs, rounds=3, options=FAST,
                           on_result=lambda name, rnd, res: seen.append((name, rnd, res.status)))
    assert set(times) == set(configs) and all(len(v) == 3 for v in times.values())
    assert sorted((n, r) for n, r, _ in seen) == sorted((n, r) for n in configs for r in range(3))
    assert all((status == "ok") == (n != "bad") for n, _, status in seen)
    assert [r for _, r, _ in seen] == sorted(r for _, r, _ in seen)  # round after round
    assert all(t is not None and t > 0 for name in ("default", "64-bit") for t in times[name])
    assert times["bad"] == [None, None, None]  # an invalid value is never timed


def test_a_worker_that_cannot_load_its_dataset_says_why():
    from rgtune.tuner.measure import WorkerStartError

    with pytest.raises(WorkerStartError, match="unknown dataset"):
        MeasureWorker(Workload("rgcn", "no-such-graph", 8, 8, 1, "reference"), FAST).start()


# ------------------------------------------------------------------ the loop
@pytest.mark.slow
@pytest.mark.parametrize("backend,status", [("_faulty_backends:Wrong", "wrong_result"),
                                            ("_faulty_backends:Segfault", "runtime_error"),
                                            ("_faulty_backends:Hang", "timeout")])
def test_faults_cost_one_trial_and_are_never_best(db, monkeypatch, backend, status):
    monkeypatch.setenv("RGTUNE_FAULT_KNOB", "layout.index_bits=64")
    trials = 5 if status == "timeout" else 8  # a hang costs its timeout and a worker's restart: fewer of them
    opts = TuneOptions(trials=trials, sampler="random", seed=3, progress=False, confirm_top=0,
                       measure=MeasureOptions(warmup=1, repeats=2, min_seconds=0.0, timeout=4.0))
    summary = Tuner(_workload(backend), db, opts).run()
    assert summary.trials_run == trials and db.count_trials() == trials
    assert summary.statuses.get(status, 0) >= 1, summary.statuses
    assert summary.statuses.get("ok", 0) >= 1
    best = db.best()
    assert best is not None and best.status == "ok" and best.knobs["layout.index_bits"] == 32
    assert all(r.knobs["layout.index_bits"] == 64 for r in db.history(status=status))


def test_the_default_schedule_is_the_first_trial_and_a_study_resumes(db):
    opts = TuneOptions(trials=3, sampler="random", seed=0, progress=False, measure=FAST, confirm_top=0)
    first = Tuner(_workload("reference"), db, opts).run()
    rows = db.history()
    from rgtune.ir.models import build_model
    from rgtune.search_spaces import SearchSpace
    from rgtune.data import load_dataset

    space = SearchSpace(build_model("rgcn", 8, 8, 1), load_dataset(GRAPH), "cpu")
    assert rows[0].knobs == space.default()
    assert first.default_ms is not None
    second = Tuner(_workload("reference"), db, opts).run()
    assert second.study_name == first.study_name and db.count_trials() == 6
    # --trials counts this run's trials; the summary says what the study had before
    assert first.earlier_measured == 0 and second.measured == 3 and second.earlier_measured == first.measured == 3
    import optuna

    study = optuna.load_study(study_name=first.study_name, storage=db.url)
    assert len(study.trials) == 6
    fresh = Tuner(_workload("reference"), db, TuneOptions(trials=1, fresh=True, progress=False, measure=FAST,
                                                            confirm_top=0)).run()
    assert fresh.study_name != first.study_name and db.count_trials() == 7 and fresh.earlier_measured == 0


def test_a_study_resumed_with_the_other_timing_says_so(db):
    opts = TuneOptions(trials=2, sampler="random", seed=0, progress=False, measure=FAST, confirm_top=0)
    first = Tuner(_workload("reference"), db, opts).run()
    paired = replace(opts, measure=replace(FAST, timing="paired"))
    with pytest.warns(UserWarning, match="was timed plain; its new trials are timed paired"):
        second = Tuner(_workload("reference"), db, paired).run()
    assert second.study_name == first.study_name and second.statuses.get("ok") == 2
    import optuna

    assert optuna.load_study(study_name=first.study_name, storage=db.url).user_attrs["rgtune.timing"] == "paired"



def test_the_fastest_schedules_are_confirmed_in_interleaved_rounds_and_decide_the_best(db):
    import statistics

    opts = TuneOptions(trials=8, sampler="random", seed=0, progress=False, measure=FAST, confirm_top=3,
                       confirm_rounds=3)
    s = Tuner(_workload("reference"), db, opts).run()
    c = s.confirmation
    search = [t for t in db.history(status="ok") if t.confirmation_id is None]
    fastest: list[str] = []
    for t in sorted(search, key=lambda t: (t.median_ms, t.id)):
        if t.schedule_hash not in fastest:
            fastest.append(t.schedule_hash)
    first = list(dict.fromkeys([*fastest[:3], search[0].schedule_hash]))  # the fastest three and the default
    assert c is not None and c.finished and c.rounds == 3 and len(first) >= 3
    assert c.searched_best_ms == min(t.median_ms for t in search)
    rounds = [t for t in db.history() if t.confirmation_id == c.id]
    assert s.measured == 8 and c.schedules == len({t.schedule_hash for t in rounds}) >= len(first)  # no budget
    for r in range(3):  # every round of the first stage times every schedule of it once
        assert {t.schedule_hash for t in rounds[r * len(first):(r + 1) * len(first)]} == set(first)
    # the lower middle round for an even count (a schedule of a second stage has more rounds), as the database's
    medians = {h: statistics.median_low(t.median_ms for t in rounds if t.schedule_hash == h)
               for h in {t.schedule_hash for t in rounds}}
    assert medians == pytest.approx(c.medians_ms)
    best = db.best()
    assert best is not None and best.confirmation_id == c.id and best.median_ms == min(medians.values())
    assert (s.best_trial_id, s.best_ms) == (best.id, best.median_ms)
    # no schedule measured faster than the confirmed best stays unconfirmed: it was timed beside the winner
    assert all(t.median_ms >= best.median_ms for t in search if t.schedule_hash not in medians)
    assert s.default_confirmed and s.default_ms == pytest.approx(medians[search[0].schedule_hash])
    # a later run confirms its own fastest schedules and the last winner, which must defend its place
    again = Tuner(_workload("reference"), db, TuneOptions(trials=2, sampler="random", seed=1, progress=False,
                                                          measure=FAST, confirm_top=2, confirm_rounds=1)).run()
    assert again.confirmation is not None
    assert best.schedule_hash in {t.schedule_hash for t in db.history() if t.confirmation_id == again.confirmation.id}
    before = db.count_trials()
    off = Tuner(_workload("reference"), db, TuneOptions(trials=1, seed=2, progress=False, measure=FAST,
                                                        confirm_top=0)).run()
    assert off.confirmation is None and db.count_trials() == before + 1
    with pytest.raises(ValueError, match="confirm_rounds"):
        Tuner(_workload("reference"), db, TuneOptions(confirm_rounds=0))

class _ScriptedTimes(Tuner):
    """A tuner whose worker verifies for real but reports the times of ``script`` (ms), one per ``ok``
    measurement, or a timeout for a ``None`` in it."""

    def __init__(self, *args, script, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.script, self.calls = iter(script), 0

    def _setup(self) -> None:
        super()._setup()
        real = self.worker.measure

        def measure(config, seed=0, best=None):
            result = real(config, seed)
            self.calls += 1
            if result.status == "ok":
                ms = next(self.script)
                if ms is None:
                    return TrialResult("timeout", error="trial exceeded its timeout")
                result = replace(result, median=ms / 1e3, times=[ms / 1e3])
            return result

        self.worker.measure = measure


def test_a_new_best_is_measured_recheck_times_and_counts_with_its_median(db):
    # default 10 -> rechecked 12, 11: 11; 20: not a new best; 9 -> 30, 12: 12, not the best after all;
    # 5 -> 6, 7: 6, the new best; 8: not a new best
    script = [10, 12, 11, 20, 9, 30, 12, 5, 6, 7, 8]
    opts = TuneOptions(trials=5, sampler="random", seed=0, progress=False, measure=FAST, confirm_top=0, recheck=3)
    tuner = _ScriptedTimes(_workload("reference"), db, opts, script=script)
    s = tuner.run()
    ok = [t for t in db.history() if t.status == "ok"]
    assert [t.median_ms for t in ok] == pytest.approx([11, 20, 12, 6, 8])
    assert tuner.calls == len(script) and s.measured == 5 and db.count_trials() == 5 and s.rechecked == 3
    assert ok[0].times_ms == pytest.approx([10, 12, 11])  # every run of every measurement stays recorded
    assert s.best_ms == pytest.approx(6) and s.best_trial_id == ok[3].id
    import optuna

    study = optuna.load_study(study_name=s.study_name, storage=db.url)
    assert study.user_attrs["rgtune.recheck"] == 3
    assert sorted(t.value for t in study.trials) == pytest.approx([6, 8, 11, 12, 20])  # the sampler sees the medians


def test_recheck_one_measures_every_trial_once(db):
    opts = TuneOptions(trials=3, sampler="random", seed=0, progress=False, measure=FAST, confirm_top=0, recheck=1)
    tuner = _ScriptedTimes(_workload("reference"), db, opts, script=[10, 9, 5])
    s = tuner.run()
    assert tuner.calls == 3 and s.rechecked == 0 and s.best_ms == pytest.approx(5)
    with pytest.raises(ValueError, match="recheck must be a count of measurements"):
        Tuner(_workload("reference"), db, TuneOptions(recheck=0))


def test_a_recheck_that_fails_is_the_trials_outcome_and_never_best(db):
    opts = TuneOptions(trials=2, sampler="random", seed=0, progress=False, measure=FAST, confirm_top=0, recheck=3)
    tuner = _ScriptedTimes(_workload("reference"), db, opts, script=[10, 11, 12, 4, None])
    s = tuner.run()
    second = db.history()[1]
    assert second.status == "timeout" and "measurement 2 of 3; the first was ok" in second.error
    assert s.best_ms == pytest.approx(11) and s.statuses == {"ok": 1, "timeout": 1}


# ------------------------------------------------------------------ kill -9, then resume
# ------------------------------------------------------------------ a pruner in the loop
class _ScriptedPruner:
    """Prunes every other candidate (or all of them) and records how the loop drives it."""

    def __init__(self, prune_all: bool = False) -> None:
        self.prune_all = prune_all
        self.calls, self.closed = 0, 0
        self.bound: list[int] = []
        self.observed: list[float | None] = []

    def bind(self, db, workload, graph, space) -> str:
        self.bound.append(workload.id)
        return "scripted pruner on"

    def __call__(self, config, point):
        self.calls += 1
        assert point.valid and point.kernels is not None  # the loop hands over the compiled point
        prune = self.prune_all or self.calls % 2 == 0
        return prune, (7.5 if prune else None)

    def observe(self, config, point, result) -> None:
        self.observed.append(result.ok_ms)

    def close(self) -> None:
        self.closed += 1

    def describe(self) -> dict:
        return {"status": "scripted pruner on", "counts": {"candidates": self.calls}}


def test_pruned_candidates_cost_no_budget_and_the_pruner_learns_every_measurement(db):
    pruner = _ScriptedPruner()
    s = Tuner(_workload("reference"), db, TuneOptions(trials=4, seed=0, progress=False, measure=FAST, confirm_top=0,
                                                       guide=pruner)).run()
    # measured, pruned, measured, pruned, ... until 4 measured: the budget counts measurements
    assert s.measured == 4 and s.statuses == {"ok": 4, "pruned": 3} and s.trials_run == 7
    assert pruner.bound == [s.workload_id] and pruner.closed == 1
    assert len(pruner.observed) == 4 and all(ms is not None and ms > 0 for ms in pruner.observed)
    pruned = db.history(s.workload_id, status="pruned")
    assert len(pruned) == 3 and all(r.predicted_ms == 7.5 and r.median_ms is None for r in pruned)
    assert db.best(s.workload_id).status == "ok"
    import optuna

    study = optuna.load_study(study_name=s.study_name, storage=db.url)
    assert study.user_attrs["rgtune.guide"] == pruner.describe() == s.guide
    assert sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials) == 3


def test_a_pruner_that_prunes_everything_cannot_stall_the_study(db):
    pruner = _ScriptedPruner(prune_all=True)
    s = Tuner(_workload("reference"), db, TuneOptions(trials=2, seed=0, progress=False, measure=FAST, guide=pruner, confirm_top=0,
                                                       max_proposals_per_trial=3)).run()
    assert s.measured == 0 and s.statuses == {"pruned": 6} and pruner.observed == [] and pruner.closed == 1


class _ScriptedRanker(_ScriptedPruner):
    """Asks for pools of 4 candidates and picks the last one."""

    def __init__(self) -> None:
        super().__init__()
        self.pools: list[list[dict]] = []
        self.picks: list[dict] = []

    def pool_size(self) -> int:
        return 4

    def local_pool(self) -> tuple[int, int]:
        return 0, 0  # every candidate from the sampler

    def __call__(self, config, point):
        super().__call__(config, point)
        return False, 2.0  # a candidate that comes alone (the default, the opening) is measured, with a prediction

    def rank(self, candidates, local=None):
        assert candidates and all(point.valid for _, point in candidates)  # only valid ones are ranked
        assert local is not None and len(local) == len(candidates) and not any(local)
        self.pools.append([dict(c) for c, _ in candidates])
        self.picks.append(dict(candidates[-1][0]))
        return len(candidates) - 1, [1.0 + i for i in range(len(candidates))]

    def opening_pool(self) -> int:
        return 0  # no opening: every measurement after the default comes from a pool

    def opening(self, candidates):
        raise AssertionError("no opening was asked for")


class _OpeningRanker(_ScriptedRanker):
    """Opens with the last two of 10 random candidates, then ranks pools like its parent."""

    def __init__(self) -> None:
        super().__init__()
        self.offered: list[dict] = []

    def opening_pool(self) -> int:
        return 10

    def opening(self, candidates):
        assert all(point.valid for _, point in candidates)
        self.offered = [dict(c) for c, _ in candidates]
        return [len(candidates) - 1, len(candidates) - 2]


class _LocalRanker(_ScriptedRanker):
    """Asks for pools of 4 with 2 local candidates (changes of the fastest schedule) and picks the last one."""

    def __init__(self) -> None:
        super().__init__()
        self.flags: list[list[bool]] = []

    def local_pool(self) -> tuple[int, int]:
        return 2, 1

    def rank(self, candidates, local=None):
        self.flags.append(list(local))
        self.pools.append([dict(c) for c, _ in candidates])
        self.picks.append(dict(candidates[-1][0]))
        return len(candidates) - 1, [1.0] * len(candidates)


def test_a_ranking_pruners_local_candidates_come_after_the_samplers_and_change_the_fastest_schedule(db):
    ranker = _LocalRanker()
    s = Tuner(_workload("reference"), db, TuneOptions(trials=5, seed=0, progress=False, measure=FAST, confirm_top=0,
                                                       guide=ranker)).run()
    assert s.measured == 5 and s.statuses == {"ok": 5}
    rows = db.history(s.workload_id)
    for i, flags in enumerate(ranker.flags):
        # the sampler's proposals first (the ranker compares its pick with the first), then the local ones
        assert flags == sorted(flags) and 0 < sum(flags) <= 2, flags
        assert flags[-1], "the picked candidate, the last one, is local"
        measured = rows[: 1 + i]  # what the study had measured when this pool was proposed
        fastest = min(measured, key=lambda r: r.median_ms).knobs
        changed = {k for k, v in ranker.picks[i].items() if fastest.get(k) != v}
        assert 1 <= len(changed) <= 3, changed  # 1-2 knobs, and one the change makes active at most
        assert all(r.knobs != ranker.picks[i] for r in measured)  # never a schedule the study has


def test_local_candidates_change_one_or_two_parameters_of_one_of_the_fastest_trials(db):
    import optuna

    from rgtune.tuner.proposals import ProposalPool as _ProposalPool
    from rgtune.tuner.study import make_sampler

    pool = _ProposalPool(make_sampler("tpe", 0), seed=0)
    assert pool.mutate(4, 2, _space()) == []  # nothing completed yet: nothing to change
    Tuner(_workload("reference"), db, TuneOptions(trials=4, seed=0, progress=False, measure=FAST, confirm_top=0)).run()
    study = optuna.load_study(study_name=optuna.get_all_study_names(db.url)[0], storage=db.url)
    pool.sync(study)
    parents = sorted(study.trials, key=lambda t: t.value)[:2]
    mutants = pool.mutate(6, 2, _space())
    assert len(mutants) == 6 and all(m.local for m in mutants)
    assert len({str(sorted(m.params.items())) for m in mutants}) == 6
    for m in mutants:
        diffs = [{k for k in p.params if k in m.params and m.params[k] != p.params[k]} for p in parents]
        assert any(1 <= len(d) <= 2 for d in diffs), (m.params, [p.params for p in parents])
        assert all(m.params != t.params for t in study.trials)
    # the copy learns nothing from them: they are told failed, the study itself never sees them
    assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in pool.copy.trials) == 4
    assert len(study.trials) == 4


def test_a_ranking_pruner_measures_its_pick_of_each_pool_and_the_study_holds_only_measurements(db):
    import optuna

    from rgtune.db.records import canonical_knobs

    ranker = _ScriptedRanker()
    s = Tuner(_workload("reference"), db, TuneOptions(trials=5, seed=0, progress=False, measure=FAST, confirm_top=0,
                                                       guide=ranker)).run()
    assert s.measured == 5 and s.statuses == {"ok": 5} and s.trials_run == 5
    assert ranker.calls == 1  # the enqueued default schedule came alone; every later measurement from a pool
    assert len(ranker.pools) == 4 and all(len(p) == 4 for p in ranker.pools)
    assert len({str(sorted(c.items())) for pool in ranker.pools for c in pool}) > 4  # the pools differ
    rows = db.history(s.workload_id)
    assert [r.knobs for r in rows[1:]] == [canonical_knobs(c)[0] for c in ranker.picks]
    assert all(r.predicted_ms == 4.0 for r in rows[1:])  # the pick's prediction is recorded with it
    assert len(ranker.observed) == 5 and ranker.closed == 1
    study = optuna.load_study(study_name=s.study_name, storage=db.url)
    # candidates not picked are not trials: the study holds the 5 measurements, linked to the history
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 5
    assert [t.user_attrs["rgtune.trial_id"] for t in study.trials] == [r.id for r in rows]
    assert [t.value for t in study.trials] == pytest.approx([r.median_ms for r in rows])


def test_a_pool_leaves_out_schedules_over_the_memory_limit_and_a_refusal_is_pruned(db):
    import random
    import statistics
    import optuna

    from rgtune.codegen.base import create
    from rgtune.codegen.buffer_plan import footprint_bytes
    from rgtune.data import load_dataset
    from rgtune.search_spaces import SearchSpace

    w = _workload("cpu", "rgat")
    graph = load_dataset(GRAPH)
    space = SearchSpace(w.program(), graph, create("cpu").target)
    rng = random.Random(0)
    sizes = [footprint_bytes(space.compile(space.sample(rng)).kernels, graph) for _ in range(40)]
    limit = int(statistics.median(sizes))  # about half of the schedules are over it
    ranker = _ScriptedRanker()
    s = Tuner(w, db, TuneOptions(trials=5, seed=0, progress=False, measure=replace(FAST, memory_limit=limit),
                                 confirm_top=0, guide=ranker)).run()
    assert s.over_memory > 0
    pools = [c for pool in ranker.pools for c in pool]
    assert pools and all(footprint_bytes(space.compile(c).kernels, graph) <= limit for c in pools)
    # what the worker refuses (its check's memory comes on top) is pruned in Optuna's study: TPE steers away
    study = optuna.load_study(study_name=s.study_name, storage=db.url)
    refused = {r.id for r in db.history(s.workload_id, status="out_of_memory")}
    assert refused  # the first trials are not ranked: one was over the limit
    states = {t.user_attrs["rgtune.trial_id"]: t.state for t in study.trials}
    assert all(states[tid] == optuna.trial.TrialState.PRUNED for tid in refused)


def test_a_new_study_measures_the_rankers_opening_after_the_default_then_pools(db):
    from rgtune.db.records import canonical_knobs

    ranker = _OpeningRanker()
    opts = TuneOptions(trials=5, seed=0, progress=False, measure=FAST, confirm_top=0, guide=ranker)
    s = Tuner(_workload("reference"), db, opts).run()
    assert s.measured == 5 and s.statuses == {"ok": 5}
    assert 2 <= len(ranker.offered) <= 10  # the valid ones of 10 random proposals
    rows = db.history(s.workload_id)
    # the default, the opening (in the ranker's order, one at a time: through __call__), then pools
    assert [r.knobs for r in rows[1:3]] == [canonical_knobs(c)[0] for c in ranker.offered[::-1][:2]]
    assert ranker.calls == 3 and len(ranker.pools) == 2
    assert [r.knobs for r in rows[3:]] == [canonical_knobs(c)[0] for c in ranker.picks]
    # a resumed study does not open again
    again = _OpeningRanker()
    Tuner(_workload("reference"), db, TuneOptions(**{**opts.__dict__, "guide": again, "trials": 1})).run()
    assert again.offered == [] and again.calls == 0 and len(again.pools) == 1


def test_the_proposal_pool_copies_every_finished_trial_of_the_study_once(db):
    import optuna

    from rgtune.tuner.proposals import ProposalPool as _ProposalPool
    from rgtune.tuner.study import make_sampler

    Tuner(_workload("reference"), db, TuneOptions(trials=3, seed=0, progress=False, measure=FAST, confirm_top=0)).run()
    study = optuna.load_study(study_name=optuna.get_all_study_names(db.url)[0], storage=db.url)
    pool = _ProposalPool(make_sampler("tpe", 0))
    pool.sync(study)
    pool.sync(study)
    finished = [t for t in pool.copy.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert sorted(t.value for t in finished) == sorted(t.value for t in study.trials)
    # another worker's trial shows up with the next sync; the proposals themselves stay off the study
    t = study.ask()
    for name, dist in study.trials[0].distributions.items():
        t.suggest_categorical(name, dist.choices)
    study.tell(t, 1.0)
    proposals = pool.propose(3, _space())
    pool.sync(study)
    assert len(study.trials) == 4 and len(proposals) == 3
    assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in pool.copy.trials) == 4


def _space():
    from rgtune.data import load_dataset
    from rgtune.ir.models import build_model
    from rgtune.search_spaces import SearchSpace

    return SearchSpace(build_model("rgcn", 8, 8, 1), load_dataset(GRAPH), "cpu")


def _tune_cmd(db_url: str, trials: int, backend: str) -> list[str]:
    return [sys.executable, "-m", "rgtune.cli", "tune", "--model", "rgcn", "--dataset", GRAPH, "--hidden", "8",
            "--trials", str(trials), "--backend", backend, "--db", db_url, "--sampler", "random", "--seed", "1",
            "--quiet", "--confirm", "0"]  # the search alone (confirmation: see its own test)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    if env.get("RGTUNE_DATA_DIR"):  # the subprocesses run in a temporary folder
        env["RGTUNE_DATA_DIR"] = os.path.abspath(env["RGTUNE_DATA_DIR"])
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), str(REPO), env.get("PYTHONPATH", "")])
    return env


@pytest.mark.slow
def test_kill_minus_9_mid_trial_then_resume(tmp_path):
    url = f"sqlite:///{tmp_path / 'results.db'}"
    env = _env()
    env["RGTUNE_SLOW_SECONDS"] = "0.1"  # a trial of ~10 runs: most of the time a trial is running
    proc = subprocess.Popen(_tune_cmd(url, 50, "_faulty_backends:Slow"), env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 120
    finished = running = 0
    while time.time() < deadline:
        time.sleep(0.3)
        if not (tmp_path / "results.db").exists():
            continue
        try:
            con = sqlite3.connect(tmp_path / "results.db", timeout=5)
            finished = con.execute("select count(*) from rg_trials where status != 'running'").fetchone()[0]
            running = con.execute("select count(*) from rg_trials where status = 'running'").fetchone()[0]
            con.close()
        except sqlite3.OperationalError:
            continue
        if finished >= 2 and running == 1:
            break
    assert finished >= 2 and running == 1, proc.stderr.read().decode() if proc.poll() is not None else "timeout"
    os.killpg(proc.pid, signal.SIGKILL)  # the tune process and its measurement worker
    proc.wait()
    db = TrialDatabase(url)
    before = {r.id: (r.status, r.median_ms) for r in db.history()}
    assert sum(1 for s, _ in before.values() if s == "running") == 1

    done = subprocess.run(_tune_cmd(url, 3, "_faulty_backends:Slow"), env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    after = {r.id: (r.status, r.median_ms) for r in db.history()}
    for tid, (status, ms) in before.items():  # earlier trials intact; the interrupted one failed
        assert after[tid] == (status, ms) if status != "running" else after[tid][0] == "failed"
    assert len(after) == len(before) + 3
    import optuna
    from optuna.trial import TrialState

    study = optuna.load_study(study_name=db.history()[0].study_name, storage=url)
    states = [t.state for t in study.trials]
    assert TrialState.RUNNING not in states and len(states) == len(after)


# ------------------------------------------------------------------ the CLI's errors
def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rgtune.cli", *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args,needle", [
    (["tune", "--model", "gcn", "--dataset", "aifb"], "unknown model 'gcn'; choose one of ['rgcn', 'rgat', 'hgt'"),
    (["tune", "--model", "rgcn", "--dataset", "nope"], "Known datasets"),
    (["tune", "--model", "rgcn", "--dataset", "aifb", "--backend", "tpu"], "choose one of"),
    (["tune", "--model", "rgcn", "--dataset", "aifb", "--sampler", "grid"], "choose one of ['tpe'"),
    (["tune", "--model", "rgcn", "--dataset", "aifb", "--timing", "blocks"], "invalid choice: 'blocks'"),
    (["tune", "--model", "rgcn", "--dataset", "aifb", "--recheck", "0"], "--recheck"),
    (["tune", "--model", "rgcn", "--dataset", "aifb", "--db", "postgresql+psycopg://u@127.0.0.1:1/x"], "connect"),
    (["tune", "--model", "rgcn", "--dataset", "aifb", "--db", "nonsense://"], "rgtune: error"),
])
def test_bad_input_is_one_line_and_non_zero(tmp_path, args, needle):
    r = _cli(*args, cwd=tmp_path)
    assert r.returncode != 0
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "results.db").exists() or "--db" in args


def test_cuda_without_a_gpu_is_a_clear_error(tmp_path):
    from rgtune.codegen.base import available_backends

    ok, _ = available_backends().get("cuda", (False, ""))
    if ok:
        pytest.skip("a CUDA GPU is usable here")
    r = _cli("tune", "--model", "rgcn", "--dataset", GRAPH, "--backend", "cuda", cwd=tmp_path)
    assert r.returncode != 0 and "cuda" in r.stderr and "Traceback" not in r.stderr


def test_a_corrupt_database_is_refused_and_left_alone(tmp_path):
    bad = tmp_path / "results.db"
    bad.write_bytes(os.urandom(4096))
    before = bad.read_bytes()
    r = _cli("tune", "--model", "rgcn", "--dataset", GRAPH, "--hidden", "8", "--trials", "1",
             "--backend", "reference", cwd=tmp_path)
    assert r.returncode != 0 and "results.db" in r.stderr and "Traceback" not in r.stderr
    assert bad.read_bytes() == before


def test_a_read_only_database_is_refused(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes read-only files anyway")
    url = f"sqlite:///{tmp_path / 'results.db'}"
    TrialDatabase(url).close()
    os.chmod(tmp_path / "results.db", 0o444)
    r = _cli("tune", "--model", "rgcn", "--dataset", GRAPH, "--trials", "1", "--backend", "reference",
             "--db", url, cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" not in r.stderr


def test_best_and_history_json(tmp_path, capsys, monkeypatch):
    """In this process (the commands' own output; their subprocess forms are covered by the CLI error tests)."""
    import json

    from rgtune.cli import main

    monkeypatch.chdir(tmp_path)

    def cli(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        rc = main(list(args))
        out, err = capsys.readouterr()
        return rc, out, err

    url = f"sqlite:///{tmp_path / 'results.db'}"
    rc, out, err = cli("tune", "--model", "rgcn", "--dataset", GRAPH, "--hidden", "8", "--trials", "3", "--backend",
                       "reference", "--db", url, "--quiet", "--sampler", "random", "--seed", "0", "--confirm-rounds", "3")
    assert rc == 0, err
    assert "best schedule" in out and "over the default schedule" in out
    assert "rechecked as a new best)" in out  # at least the default schedule, the first best
    hist = json.loads(cli("history", "--db", url, "--json")[1])
    search = [t for t in hist if t["confirmation_id"] is None]
    schedules = len({t["schedule_hash"] for t in search if t["status"] == "ok"})
    assert len(search) == 3 and len(hist) == 3 + (3 * schedules if schedules >= 2 else 0)
    best = json.loads(cli("best", "--model", "rgcn", "--db", url, "--json")[1])
    assert best[0]["status"] == "ok" and "layout.edges" in best[0]["knobs"]
    if schedules >= 2:
        assert "confirmed: median of the rounds" in out and best[0]["confirmation_id"] is not None
        assert "median of the 3 rounds of confirmation" in cli("best", "--model", "rgcn", "--db", url)[1]
        assert "confirm " in cli("history", "--db", url)[1]
    assert "--confirm must be 0" in cli("tune", "--model", "rgcn", "--dataset", GRAPH, "--confirm", "1")[2]
    assert cli("best", "--model", "hgt", "--db", url)[0] != 0


# ------------------------------------------------------------------ many workers, one PostgreSQL study
import _postgres  # noqa: E402  (the session-wide local PostgreSQL server; skips with its reason)

postgres_server = _postgres.postgres_server
postgres_url = _postgres.postgres_url


@pytest.mark.slow
def test_two_workers_share_one_postgres_study(postgres_url, tmp_path):
    n = 4
    cmd = _tune_cmd(postgres_url, n, "reference")
    procs = [subprocess.Popen(cmd, env=_env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    db = TrialDatabase(postgres_url)
    rows = db.history()
    assert len(rows) == 2 * n
    assert len({r.optuna_trial for r in rows}) == 2 * n  # no Optuna trial recorded twice
    assert len({r.worker for r in rows}) == 2  # both processes measured
    import optuna

    study = optuna.load_study(study_name=rows[0].study_name, storage=postgres_url)
    assert len(study.trials) == 2 * n
    assert sorted(t.number for t in study.trials) == sorted(r.optuna_trial for r in rows)


@pytest.mark.slow
def test_two_workers_on_one_sqlite_file_work_or_refuse_clearly(tmp_path):
    url = f"sqlite:///{tmp_path / 'results.db'}"
    n = 4
    procs = [subprocess.Popen(_tune_cmd(url, n, "reference"), env=_env(), cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    ok = [p.returncode == 0 for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert "Traceback" not in err
        if p.returncode != 0:
            assert "PostgreSQL" in err, err
    db = TrialDatabase(url)
    rows = db.history()
    assert len(rows) == n * sum(ok) + sum(1 for r in rows if r.status == "failed")
    assert len({r.optuna_trial for r in rows}) == len(rows)


def test_an_error_that_poisons_the_process_restarts_the_worker():
    with MeasureWorker(_workload("_faulty_backends:Poisoned"), FAST) as w:
        r = w.measure({}, seed=0)
        assert r.status == "runtime_error" and "illegal memory access" in r.error
        w.measure({}, seed=1)
        assert w.restarts == 1


def test_timing_noise_records_its_settings_without_this_machines_paths(load_experiment, tmp_path):
    import doctest

    noise = load_experiment("timing_noise")
    assert doctest.testmod(noise).failed == 0
    assert noise._shown(tmp_path / "out") == "out"  # a folder outside the repository: its name only
    assert noise._shown(noise.RESULTS) == "experiments/results/timing_noise"
