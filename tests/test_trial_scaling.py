"""Trials that scale to big graphs: sampled verification in the worker, early stop of slow candidates,
the adaptive timeout, memory refused before running and measured after, the confirmation's budget."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rgtune.db import TrialDatabase
from rgtune.db.trial_result import Coverage
from rgtune.tuner.confirmation import MIN_ROUNDS, Confirmation
from rgtune.tuner.measure import ADAPTIVE_TIMEOUT_MIN, STOP_MIN_S, MeasureOptions, MeasureWorker
from rgtune.tuner.study import TuneOptions, Tuner
from rgtune.tuner.workload import Workload

GRAPH = "synthetic:custom,nodes=400,edges=3000,ntypes=2,rels=4,seed=2"
FAST = MeasureOptions(warmup=1, repeats=2, min_seconds=0.0)
REPO = Path(__file__).resolve().parents[1]


def _workload(mode: str = "inference", model: str = "rgat") -> Workload:
    return Workload(model, GRAPH, 8, 8, 2 if model == "rgat" else 1, "cpu", mode=mode)


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_a_sampled_trial_verifies_the_sampled_rows_and_records_what_it_covered(mode):
    opts = MeasureOptions(warmup=1, repeats=2, min_seconds=0.0, verify="sampled", verify_rows=16)
    with MeasureWorker(_workload(mode), opts) as w:
        r = w.measure({}, seed=3)
    assert r.status == "ok" and r.max_error < 1e-4, r.error
    d = r.details
    assert d.verified.sampled and d.verified.rows == 16 and 0 < d.verified.edges < 3000
    assert d.verify_seconds > 0 and d.memory.peak_bytes > 0 and d.memory.estimated_bytes > 0


def test_a_wrong_kernel_fails_sampled_verification():
    opts = MeasureOptions(warmup=1, repeats=2, verify="sampled", verify_rows=16)
    with MeasureWorker(Workload("rgcn", GRAPH, 8, 8, 1, "_faulty_backends:Wrong"), opts) as w:
        r = w.measure({}, seed=0)
    assert r.status == "wrong_result" and "relative error" in r.error and r.details.verified.sampled


def test_a_candidate_much_slower_than_the_best_is_stopped_after_its_first_run():
    with MeasureWorker(_workload(), FAST) as w:
        r = w.measure({}, seed=1, best=1e-9)  # a best of a nanosecond: anything is 3x slower ...
        assert r.status == "ok" and r.median < STOP_MIN_S  # ... but a first run under STOP_MIN_S is never stopped
    slow = Workload("rgcn", GRAPH, 8, 8, 1, "_faulty_backends:Slow")
    with MeasureWorker(slow, FAST) as w:
        r = w.measure({}, seed=1, best=1e-9)
        assert r.status == "stopped" and r.median is None and r.times == []
        assert r.details.first_run_ms > 0 and "stopped after its first run" in r.error
        # the limit was the floor (3 x a nanosecond is under it): the message names the floor, not "3 x the best"
        assert "over 50 ms (the early stop's floor, which 3 x the best so far is under)" in r.error
        assert w.measure({}, seed=1, best=1e3).status == "ok"  # a best of 1000 s: never stopped
    with MeasureWorker(_workload(), MeasureOptions(warmup=1, repeats=2, stop_slower=None)) as w:
        assert w.measure({}, seed=1, best=1e-9).status == "ok"  # stop_slower None: never stopped


def test_the_timeout_adapts_to_the_slowest_verified_trial():
    opts = MeasureOptions(warmup=1, repeats=2, first_timeout=123.0)
    with MeasureWorker(_workload(), opts) as w:
        assert w.timeout == 123.0  # nothing measured yet
        r = w.measure({}, seed=0)
        assert r.status == "ok" and w.timeout == max(ADAPTIVE_TIMEOUT_MIN, 5 * r.details.elapsed_s)
    with MeasureWorker(_workload(), MeasureOptions(timeout=7.0)) as w:
        assert w.timeout == 7.0  # given: fixed


def test_a_candidate_over_the_memory_limit_is_refused_before_running():
    with MeasureWorker(_workload(), MeasureOptions(memory_limit=1000)) as w:
        r = w.measure({}, seed=0)
    assert r.status == "out_of_memory" and r.details.memory.refused and r.compile_seconds is None
    assert r.details.memory.estimated_bytes > 1000 and "over the memory limit" in r.error


def test_a_refusal_after_the_first_costs_no_reference_run():
    from rgtune.tuner.measure import _Session

    session = _Session(_workload(), MeasureOptions(memory_limit=1000))
    made = []
    real = session.verifier.case
    session.verifier.case = lambda seed: made.append(seed) or real(seed)
    first, second = session.measure({}, seed=0), session.measure({}, seed=1)
    assert first.status == second.status == "out_of_memory" and first.details.memory.refused
    assert made == [0]  # the second was refused on the first case's size, before its oracle ran
    assert second.details.memory.estimated_bytes == first.details.memory.estimated_bytes


def test_the_limit_is_on_the_buffers_and_the_checks_memory_counts_against_the_free_memory():
    from rgtune.codegen.base import create
    from rgtune.codegen.buffer_plan import footprint_bytes
    from rgtune.data import load_dataset
    from rgtune.search_spaces import SearchSpace
    from rgtune.tuner.measure import _Session

    w = _workload()
    graph = load_dataset(GRAPH)
    point = SearchSpace(w.program(), graph, create("cpu").target).compile({})
    buffers = footprint_bytes(point.kernels, graph)
    # the user's limit is what the schedule may take: the buffers fit, the check's memory is not the schedule's
    fits = _Session(w, MeasureOptions(memory_limit=buffers + 1000)).measure({}, seed=0)
    assert fits.status == "ok" and fits.details.memory.buffer_bytes == buffers
    assert fits.details.memory.estimated_bytes > buffers + 1000  # the case's inputs and expected results (400 x 8 floats+)
    over = _Session(w, MeasureOptions(memory_limit=buffers - 1)).measure({}, seed=0)
    assert over.status == "out_of_memory" and "over the memory limit of" in over.error
    # the machine's protection counts the case: buffers and check over the share of the free memory
    session = _Session(w, MeasureOptions())
    session.memory.free_limit = buffers + 1000
    r = session.measure({}, seed=0)
    assert r.status == "out_of_memory" and r.details.memory.refused, r.error
    assert "verification's inputs and results" in r.error and "of the memory free" in r.error
    assert r.details.memory.estimated_bytes > r.details.memory.free_limit_bytes == buffers + 1000


def test_options_are_checked():
    with pytest.raises(ValueError, match=r"unknown verify 'some'; choose one of \['auto', 'full', 'sampled'\]"):
        MeasureOptions(verify="some")
    with pytest.raises(ValueError, match="stop_slower must be a factor above 1"):
        MeasureOptions(stop_slower=0.5)
    with pytest.raises(ValueError, match="memory_limit must be a positive amount of memory, got 0"):
        MeasureOptions(memory_limit=0)
    with pytest.raises(ValueError, match="repeats must be a count of runs, 1 or more, got 0"):
        MeasureOptions(repeats=0)


def test_a_study_records_peak_memory_and_refusals(tmp_path):
    db = TrialDatabase(f"sqlite:///{tmp_path / 'results.db'}")
    Tuner(_workload("training", "rgcn"), db, TuneOptions(trials=2, seed=0, progress=False, confirm_top=0,
                                                          measure=FAST)).run()
    ok = db.history(status="ok")
    assert ok and all(t.peak_bytes and t.peak_bytes > 0 for t in ok)
    assert all(t.details.verified == Coverage() for t in ok)
    small = replace_limit(FAST, 1000)
    Tuner(_workload("inference", "rgcn"), db, TuneOptions(trials=2, seed=0, progress=False, confirm_top=0,
                                                           measure=small)).run()
    refused = db.history(status="out_of_memory")
    assert len(refused) == 2 and all(t.details.memory.refused and t.peak_bytes > 1000 for t in refused)


def replace_limit(options: MeasureOptions, limit: int) -> MeasureOptions:
    from dataclasses import replace

    return replace(options, memory_limit=limit)


class _Default:
    schedule_hash = "default"


@pytest.mark.parametrize("budget,expect", [
    (None, (7, 5)),        # no budget: every schedule, every round
    (1000.0, (7, 5)),      # affords 100 measurements: all 35
    (25.0, (7, MIN_ROUNDS)),  # 25 measurements: 3 rounds of 7 (21)
    (9.5, (3, MIN_ROUNDS)),   # 9 measurements: the fastest, the default and the last winner, 3 rounds
    (6.0, (2, MIN_ROUNDS)),   # 6: the fastest and the default
    (5.0, (0, MIN_ROUNDS)),   # 5: not even two schedules three times: no rounds
])
def test_the_confirmation_fits_its_budget(budget, expect):
    c = Confirmation.__new__(Confirmation)
    c.rounds, c.budget_s, c.measurement_s, c.default, c.also = 5, budget, 1.0, _Default(), {}
    knobs = {h: {} for h in ("f1", "f2", "f3", "f4", "f5", "previous", "default")}
    kept = c._fit(knobs, "previous")
    assert (len(kept), c.rounds) == expect
    if 2 <= len(kept) < len(knobs):  # trimmed: the fastest and the default first
        assert list(kept)[:2] == ["f1", "default"]


def test_a_schedule_asked_for_stays_in_a_trimmed_confirmation():
    """A sampler study's whole-graph best (``also``) is kept right after the default when the budget trims."""
    c = Confirmation.__new__(Confirmation)
    c.rounds, c.budget_s, c.measurement_s, c.default, c.also = 5, 9.5, 1.0, _Default(), {"whole": {}}
    knobs = {h: {} for h in ("f1", "f2", "f3", "f4", "f5", "previous", "default", "whole")}
    kept = c._fit(knobs, "previous")
    assert list(kept) == ["f1", "default", "whole"] and c.rounds == 3


def test_tune_memory_limit_on_the_command_line(tmp_path):
    db = tmp_path / "r.db"
    r = subprocess.run([sys.executable, "-m", "rgtune.cli", "tune", "--model", "rgcn", "--dataset", GRAPH, "--hidden", "8",
                        "--trials", "2", "--backend", "cpu", "--db", f"sqlite:///{db}", "--memory-limit", "0.000001",
                        "--cost-model", "off", "--quiet"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "out_of_memory 2" in r.stdout, r.stdout
    bad = subprocess.run([sys.executable, "-m", "rgtune.cli", "tune", "--model", "rgcn", "--dataset", GRAPH,
                          "--memory-limit", "-1", "--db", f"sqlite:///{db}"], capture_output=True, text=True, cwd=REPO,
                         timeout=300)
    assert bad.returncode != 0 and "--memory-limit must be a positive amount of memory, got -1" in bad.stderr


def test_a_big_graph_worker_frees_the_last_trials_memory_before_the_next(monkeypatch):
    """A built program's buffers sit in reference cycles; on a big graph the worker collects them before
    each trial (a few trials' workspaces took a worker past the machine's memory on AM), and before the
    layer as called builds its own (not both programs' buffers at once)."""
    import gc

    from rgtune.tuner.measure import _Session

    calls = []
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append(a) or 0)
    sampled = _Session(_workload(), MeasureOptions(warmup=1, repeats=2, verify="sampled", verify_rows=16))
    sampled.measure({}, seed=0)
    assert len(calls) == 2
    full = _Session(_workload(), MeasureOptions(warmup=1, repeats=2, verify="full"))
    full.measure({}, seed=0)
    assert len(calls) == 2  # a small graph's trial does not pay for a full collection
