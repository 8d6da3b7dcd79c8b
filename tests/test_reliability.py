"""The tuner under bad conditions: the best re-verified, a summary that compares like with like, a study
that agrees with ``rgtune best``, heartbeats, a worker that dies with its parent or cannot restart, and
database failures that reach the loop through Optuna."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from rgtune.db import DatabaseError, TrialDatabase
from rgtune.tuner.measure import MeasureOptions, MeasureWorker, WorkerStartError, start_method
from rgtune.tuner.study import TuneOptions, Tuner
from rgtune.tuner.workload import Workload

from _processes import alive, children, fork_servers, measurement_workers

GRAPH = "synthetic:custom,nodes=300,edges=2500,ntypes=2,rels=4,seed=1"
FAST = MeasureOptions(warmup=1, repeats=2, min_seconds=0.0, timeout=20.0)
REPO = Path(__file__).resolve().parents[1]


def _workload(backend: str = "reference") -> Workload:
    return Workload("rgcn", GRAPH, 8, 8, 1, backend)


@pytest.fixture
def db(tmp_path):
    return TrialDatabase(f"sqlite:///{tmp_path / 'results.db'}")


def _study(db: TrialDatabase, summary) -> optuna.Study:
    return optuna.load_study(study_name=summary.study_name, storage=db.url)


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, **extra)
    if env.get("RGTUNE_DATA_DIR"):
        env["RGTUNE_DATA_DIR"] = os.path.abspath(env["RGTUNE_DATA_DIR"])
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), str(REPO), env.get("PYTHONPATH", "")])
    return env


# ------------------------------------------------------------------ re-verification of the best
def test_the_best_schedule_is_verified_again_on_fresh_inputs_and_that_is_recorded(db):
    s = Tuner(_workload(), db, TuneOptions(trials=3, seed=0, progress=False, measure=FAST, confirm_top=0)).run()
    best = db.best(s.workload_id)
    assert best is not None and best.verified_inputs == 3 and s.best_verified_inputs == 3
    (v,) = db.verifications(s.workload_id)
    assert (v.schedule_hash, v.status, v.inputs, v.runs) == (best.schedule_hash, "ok", 3, 2)
    assert v.max_error is not None and v.max_error < 1e-4
    # a later run does not verify the same best again
    Tuner(_workload(), db, TuneOptions(trials=1, seed=1, progress=False, measure=FAST, confirm_top=0)).run()
    assert len([x for x in db.verifications(s.workload_id) if x.schedule_hash == best.schedule_hash]) == 1


def test_a_kernel_that_passes_one_verification_by_luck_is_never_the_best(db):
    # right on a program's first run (the trial's verification), wrong on later runs: the trials are ok,
    # the re-verification runs each fresh input twice and catches it, every time
    s = Tuner(_workload("_faulty_backends:Flaky"), db,
              TuneOptions(trials=3, seed=0, progress=False, measure=FAST, confirm_top=0)).run()
    assert s.statuses == {"ok": 3}
    failed = db.verifications(s.workload_id)
    assert failed and all(v.status == "wrong_result" and "run 2 of 2" in v.error for v in failed)
    assert {v.schedule_hash for v in failed} == {t.schedule_hash for t in db.history(s.workload_id)}
    assert db.best(s.workload_id) is None and s.best_ms is None
    study = _study(db, s)
    assert all(t.state == TrialState.FAIL for t in study.trials)  # the study never calls them best


# ------------------------------------------------------------------ the summary and the study agree
class _DefaultFastest(Tuner):
    """A tuner whose worker verifies for real but times the default schedule at 1 ms, every other at 2 ms."""

    def _setup(self) -> None:
        super()._setup()
        real, default = self.worker.measure, self.space.default()

        def measure(config, seed=0, best=None):
            result = real(config, seed)
            if result.status == "ok":
                ms = 1.0 if dict(config) == default else 2.0
                result = replace(result, median=ms / 1e3, times=[ms / 1e3])
            return result

        self.worker.measure = measure


def test_when_the_default_wins_the_summary_says_so_and_compares_confirmed_medians(db, capsys):
    from rgtune.cli.tune import _print_summary

    s = _DefaultFastest(_workload(), db, TuneOptions(trials=4, sampler="random", seed=0, progress=False,
                                                     measure=FAST, confirm_top=2, confirm_rounds=3)).run()
    assert s.default_is_best and s.default_confirmed and s.speedup == 1.0
    _print_summary(s)
    out = capsys.readouterr().out
    assert "best schedule: the default schedule, 1 ms (confirmed: median of the rounds): no searched schedule beat it" \
        in out and "1.00x" not in out
    assert "default schedule: 1 ms (median of the confirmation's rounds)" in out


def test_the_studys_best_trial_is_the_schedule_rgtune_best_returns(db):
    s = Tuner(_workload(), db, TuneOptions(trials=8, sampler="random", seed=3, progress=False, measure=FAST,
                                           confirm_top=3, confirm_rounds=3)).run()
    best = db.best(s.workload_id)
    study = _study(db, s)
    assert study.metric_names == ["milliseconds"]
    assert db.trial(study.best_trial.user_attrs["rgtune.trial_id"]).schedule_hash == best.schedule_hash
    assert study.best_value == pytest.approx(best.median_ms)
    # every trial of a confirmed schedule holds its confirmed median
    medians = s.confirmation.medians_ms
    for t in study.trials:
        h = db.trial(t.user_attrs["rgtune.trial_id"]).schedule_hash
        if h in medians and t.state == TrialState.COMPLETE:
            assert t.value == pytest.approx(medians[h])


# ------------------------------------------------------------------ heartbeats and a trial failed by another
def test_a_long_trial_keeps_its_heartbeat_and_survives_being_declared_abandoned(db, monkeypatch):
    monkeypatch.setenv("RGTUNE_SLOW_SECONDS", "0.6")
    opts = TuneOptions(trials=2, seed=0, progress=False, confirm_top=0,
                       measure=MeasureOptions(warmup=1, repeats=2, min_seconds=0.0, timeout=60.0, heartbeat_s=0.2))
    intervened: dict[str, object] = {}

    def another_worker() -> None:
        # a worker elsewhere, for whom our heartbeats are never recent enough (stale_after=0)
        other = TrialDatabase(db.url)
        deadline = time.time() + 60
        while time.time() < deadline and "trial" not in intervened:
            running = other.history(status="running")
            if running and running[0].heartbeat_at is not None:
                intervened["heartbeat"] = running[0].heartbeat_at
                intervened["trial"] = other.mark_stale_running(worker="elsewhere:1", stale_after=0.0)
                for name in optuna.get_all_study_names(db.url):
                    study = optuna.load_study(study_name=name, storage=db.url)
                    for t in study.get_trials(states=(TrialState.RUNNING,)):
                        study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
            time.sleep(0.1)

    thread = threading.Thread(target=another_worker)
    thread.start()
    s = Tuner(_workload("_faulty_backends:Slow"), db, opts).run()
    thread.join()
    assert intervened.get("heartbeat") is not None and intervened.get("trial"), intervened
    (tid,) = intervened["trial"]
    assert db.trial(tid).status == "ok"  # the owner's measurement replaced the other worker's verdict
    study = _study(db, s)
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert tid in [t.user_attrs.get("rgtune.trial_id") for t in complete] and s.statuses == {"ok": 2}


# ------------------------------------------------------------------ the worker's life
def test_a_forked_worker_starts_with_the_parents_environment_and_threads_of_that_moment(monkeypatch):
    """A CPU worker is forked by a server that started with the first worker: the second must still see
    what the parent has when it starts (a ``scoped_env`` setting, ``tune --threads``), not the server's."""
    import torch

    assert start_method("_faulty_backends:Environ") == "forkserver" and start_method("cuda") == "spawn"
    threads = torch.get_num_threads()
    seen = []
    try:
        for mark, n in (("first", threads), ("second", 1 if threads > 1 else 2)):
            monkeypatch.setenv("RGTUNE_TEST_MARK", mark)
            torch.set_num_threads(n)
            worker = MeasureWorker(_workload("_faulty_backends:Environ"), FAST)
            try:
                info = worker.start()
                seen.append((info["mark"], info["threads"]))
                assert worker.measure({}).status == "ok"
            finally:
                worker.close()
    finally:
        torch.set_num_threads(threads)
    assert seen == [("first", threads), ("second", 1 if threads > 1 else 2)]


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the worker through /proc")
@pytest.mark.slow
def test_the_measurement_worker_dies_with_a_killed_tune(tmp_path):
    # the worker hangs in a kernel (an idle one would notice its parent's end on its pipe anyway)
    cmd = [sys.executable, "-m", "rgtune.cli", "tune", "--model", "rgcn", "--dataset", GRAPH, "--hidden", "8",
           "--trials", "50", "--backend", "_faulty_backends:Hang", "--db", f"sqlite:///{tmp_path / 'r.db'}",
           "--quiet", "--cost-model", "off", "--trial-timeout", "600"]
    proc = subprocess.Popen(cmd, env=_env(), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list[int] = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not workers:
            time.sleep(0.2)
            workers = measurement_workers(proc.pid)
        assert workers, "the measurement worker did not start"
        workers += fork_servers(proc.pid)  # the server too must not outlive tune
        time.sleep(3)  # into its first trial
        os.kill(proc.pid, signal.SIGKILL)  # the tune process alone, not its process group
        proc.wait()
        deadline = time.time() + 10
        while time.time() < deadline and any(alive(p) for p in workers):
            time.sleep(0.1)
        assert not any(alive(p) for p in workers)
    finally:  # an orphaned worker (the failure this test is about) must not outlive the test
        for p in {*workers, *children(proc.pid)}:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_worker_that_cannot_restart_costs_its_trial_and_three_in_a_row_end_the_run(db, monkeypatch):
    from rgtune.tuner import measure

    real_start, calls = measure.MeasureWorker.start, []

    def start(self):
        calls.append(1)
        if len(calls) > 1:  # the first start works; every restart fails
            raise WorkerStartError("out of memory (simulated)")
        return real_start(self)

    monkeypatch.setattr(measure.MeasureWorker, "start", start)
    tuner = Tuner(_workload("_faulty_backends:Segfault"), db,
                  TuneOptions(trials=6, seed=0, progress=False, measure=FAST, confirm_top=0))
    with pytest.raises(WorkerStartError, match="3 restarts of the measurement worker failed in a row"):
        tuner.run()
    statuses = [t.status for t in db.history()]
    assert statuses == ["runtime_error", "failed", "failed", "failed"]
    assert all("could not be restarted: out of memory (simulated)" in t.error for t in db.history()[1:])


# ------------------------------------------------------------------ the database failing under Optuna
def test_a_full_disk_during_optunas_commit_is_one_line_and_the_study_resumes(tmp_path, monkeypatch, capsys):
    import sqlalchemy.exc as sa_exc
    from optuna.exceptions import StorageInternalError

    from rgtune.cli import main

    url = f"sqlite:///{tmp_path / 'results.db'}"
    real_tell, told = optuna.study.Study.tell, []

    def tell(self, *args, **kwargs):
        told.append(1)
        if len(told) >= 2:  # the first trial is told; every later tell finds the disk full
            try:
                raise sa_exc.OperationalError("UPDATE trials", {}, sqlite3.OperationalError("database or disk is full"))
            except sa_exc.OperationalError as e:
                raise StorageInternalError("An exception is raised during the commit.") from e
        return real_tell(self, *args, **kwargs)

    monkeypatch.setattr(optuna.study.Study, "tell", tell)
    args = ["tune", "--model", "rgcn", "--dataset", GRAPH, "--hidden", "8", "--trials", "3", "--backend", "reference",
            "--db", url, "--quiet", "--cost-model", "off", "--confirm", "0"]
    assert main(args) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("tuning rgcn") and len(err) == 2 and err[1].startswith("rgtune: error: ")
    assert "database or disk is full" in err[1] and "is the disk full" in err[1]
    with pytest.raises(DatabaseError):  # the library says the same through a DatabaseError
        Tuner(_workload(), TrialDatabase(url), TuneOptions(trials=3, progress=False, measure=FAST, confirm_top=0)).run()
    monkeypatch.setattr(optuna.study.Study, "tell", real_tell)
    assert main(args) == 0  # resumes: the trial whose tell failed is failed in the study, counted in the history
    db = TrialDatabase(url)
    assert not db.history(status="running")
    study = optuna.load_study(study_name=db.history()[0].study_name, storage=url)
    assert TrialState.RUNNING not in [t.state for t in study.trials]


def test_a_trial_timeout_must_be_positive(capsys):
    from rgtune.cli import main

    for bad in ("-5", "0", "nan", "inf", "soon"):
        with pytest.raises(SystemExit) as exit_:
            main(["tune", "--model", "rgcn", "--dataset", GRAPH, "--trial-timeout", bad])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "--trial-timeout: expected a " in err and bad in err
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds, got -5"):
        MeasureOptions(timeout=-5)
