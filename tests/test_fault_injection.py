"""A study under every fault at once: every trial accounted for, the database intact.

One workload is tuned on the cpu backend (generated C and its compile cache) through a sequence of
``tune`` processes, while this test injects, in order:

1. a kernel that hangs (the schedules matching ``RGTUNE_HANG_KNOBS``: about one in twelve),
   throughout;
2. ``kill -9`` of the measurement worker in the middle of a run;
3. a corrupted compile cache between runs (libraries truncated or overwritten, stale temporaries);
4. ``kill -9`` of the ``tune`` process itself in the middle of a run, then a resume;
5. a full disk under the database (a small tmpfs filled up), then space freed and a resume;
6. a last run that ends normally, with the confirmation and the re-verification.

At the end: every trial is finished in rgtune's history and in Optuna's studies (none ``running``),
each search trial of the history is one trial of a study with the matching outcome, at least
``RGTUNE_FAULT_TRIALS`` trials were measured, and SQLite's integrity and foreign-key checks pass.
The test prints the figures. ``RGTUNE_FAULT_TRIALS`` (default 24) sets the size: the run reported in
the README used 200. Needs root (to mount the tmpfs) and /proc; it skips with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from _processes import measurement_workers

REPO = Path(__file__).resolve().parents[1]
GRAPH = "synthetic:custom,nodes=300,edges=2500,ntypes=2,rels=4,seed=1"
TRIALS = int(os.environ.get("RGTUNE_FAULT_TRIALS", "24"))
HANG = "traversal.chunk=16,layout.edges=csr_dst"  # 1 in 12 random schedules hangs
TIMEOUT = 4.0  # seconds per trial: a hang costs this much


@pytest.fixture
def disk(tmp_path):
    """A 16 MiB tmpfs for the database (skips where it cannot be mounted)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip() or r.returncode}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _env(cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    if env.get("RGTUNE_DATA_DIR"):
        env["RGTUNE_DATA_DIR"] = os.path.abspath(env["RGTUNE_DATA_DIR"])
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), str(REPO), env.get("PYTHONPATH", "")])
    env.update(RGTUNE_HANG_KNOBS=HANG, RGTUNE_KERNEL_CACHE=str(cache / "cuda"), RGTUNE_CACHE_DIR=str(cache))
    return env


class _Run:
    """One ``tune`` process of the study."""

    def __init__(self, db: Path, trials: int, env: dict[str, str], cwd: Path, confirm: int = 0) -> None:
        cmd = [sys.executable, "-m", "rgtune.cli", "tune", "--model", "rgcn", "--dataset", GRAPH, "--hidden", "8",
               "--backend", "_faulty_backends:ChaosCpu", "--db", f"sqlite:///{db}", "--trials", str(trials),
               "--sampler", "random", "--seed", "5", "--cost-model", "off", "--trial-timeout", str(TIMEOUT),
               "--confirm", str(confirm), "--confirm-rounds", "3", "--quiet"]
        self.proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def finish(self, timeout: float = 1800) -> tuple[int, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, err


def _count(db: Path, running: bool = False) -> int:
    """Finished trials of the database (running ones with ``running``); 0 while it cannot be read."""
    try:
        con = sqlite3.connect(db, timeout=10)
        try:
            op = "=" if running else "!="
            return con.execute(f"SELECT count(*) FROM rg_trials WHERE status {op} 'running'").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def _finished(db: Path) -> int:
    return _count(db)


def _wait_for(db: Path, count: int, run: _Run, deadline_s: float = 900, mid_trial: bool = False) -> None:
    """Until ``count`` trials are finished (and, with ``mid_trial``, one is running)."""
    deadline = time.time() + deadline_s
    while _finished(db) < count or (mid_trial and not _count(db, running=True)):
        assert run.proc.poll() is None, f"tune ended early: {run.finish()}"
        assert time.time() < deadline, "the study stopped making progress"
        time.sleep(0.2)


def _corrupt(cache: Path) -> dict[str, int]:
    libraries = sorted(cache.rglob("*.so"))
    for i, lib in enumerate(libraries):
        data = lib.read_bytes()
        lib.write_bytes(data[: len(data) // 2] if i % 2 == 0 else b"\x7fELF" + os.urandom(len(data) - 4))
    stale = cache / "kernels" / f"deadbeef.so.{999_999}.tmp"
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_bytes(b"half a library")
    old = time.time() - 7200
    os.utime(stale, (old, old))
    return {"libraries corrupted": len(libraries), "stale temporaries": 1}


def _stale_left(cache: Path) -> list[Path]:
    return list((cache / "kernels").glob("deadbeef.so.*.tmp"))


def _fill(disk: Path) -> Path:
    filler = disk / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError:
            pass
    return filler


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the measurement worker through /proc")
def test_a_study_under_every_fault_accounts_for_every_trial(tmp_path, disk):
    cache, db = tmp_path / "cache", disk / "results.db"
    env, events = _env(cache), Counter()
    t0 = time.time()
    quarter = max(TRIALS // 4, 6)

    # 1-2: hangs throughout; the worker killed in the middle of the first run
    run = _Run(db, quarter, env, tmp_path)
    _wait_for(db, quarter // 2, run, mid_trial=True)
    time.sleep(0.3)  # the parent hands the trial to the worker after compiling its kernel IR
    for pid in measurement_workers(run.proc.pid):
        os.kill(pid, signal.SIGKILL)
        events["worker killed"] += 1
    rc, err = run.finish()
    assert rc == 0, err

    # 3: the compile cache corrupted between runs
    events.update(_corrupt(cache))
    done = _finished(db)
    run = _Run(db, quarter, env, tmp_path)

    # 4: the tune process killed in the middle of a run, then resumed
    _wait_for(db, done + quarter // 2, run, mid_trial=True)
    run.proc.kill()
    run.finish()
    events["tune killed"] += 1
    rc, err = _Run(db, quarter // 2, env, tmp_path).finish()
    assert rc == 0, err

    # 5: the database's disk full: the run ends with one line (or finishes, if SQLite's journal had room)
    filler = _fill(disk)
    rc, err = _Run(db, quarter // 2, env, tmp_path).finish()
    lines = [ln for ln in err.splitlines() if ln.startswith("rgtune: error:")]
    assert "Traceback" not in err and (rc == 0 or (rc == 1 and len(lines) == 1 and "full" in lines[0])), err
    events["disk full, run " + ("ended with one line" if rc else "finished")] += 1
    filler.unlink()

    # 6: a last run to the budget, with the confirmation and the re-verification
    con = sqlite3.connect(db)
    measured = con.execute("SELECT count(*) FROM rg_trials WHERE confirmation_id IS NULL AND status != 'running'").fetchone()[0]
    con.close()
    rc, err = _Run(db, max(TRIALS - measured, 3), env, tmp_path, confirm=3).finish()
    assert rc == 0, err

    # every trial accounted for
    con = sqlite3.connect(db)
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert con.execute("PRAGMA foreign_key_check").fetchall() == []
        statuses = Counter(dict(con.execute("SELECT status, count(*) FROM rg_trials WHERE confirmation_id IS NULL "
                                            "GROUP BY status").fetchall()))
        rounds = con.execute("SELECT count(*) FROM rg_trials WHERE confirmation_id IS NOT NULL").fetchone()[0]
        running = con.execute("SELECT count(*) FROM rg_trials WHERE status = 'running'").fetchone()[0]
        ours = dict(con.execute("SELECT optuna_trial, status FROM rg_trials WHERE confirmation_id IS NULL "
                                "AND optuna_trial IS NOT NULL").fetchall())
        optuna_states = Counter(s for (s,) in con.execute("SELECT state FROM trials").fetchall())
        by_number = dict(con.execute("SELECT number, state FROM trials").fetchall())
        verified = con.execute("SELECT status, inputs FROM rg_verifications").fetchall()
    finally:
        con.close()
    assert running == 0 and "RUNNING" not in optuna_states
    assert sum(statuses.values()) >= TRIALS
    assert all((by_number.get(n) == "COMPLETE") == (s == "ok") for n, s in ours.items()), (ours, by_number)
    # a killed worker costs at most its trial: runtime_error when the kill lands inside a trial; between two
    # trials (they take a fraction of a second here) the next one just starts a fresh worker
    assert statuses["timeout"] >= 1 and events["worker killed"] >= 1, (statuses, events)
    assert statuses["runtime_error"] <= events["worker killed"], (statuses, events)
    assert statuses["failed"] >= 1  # the trial the killed tune left running
    assert verified and verified[-1][0] == "ok"
    assert _stale_left(cache) == []  # the stale temporary was cleaned
    figures = {"trials": sum(statuses.values()), "statuses": dict(statuses), "confirmation rounds": rounds,
               "optuna trials": dict(optuna_states), "faults": dict(events), "verifications": len(verified),
               "seconds": round(time.time() - t0)}
    print("fault injection:", json.dumps(figures, sort_keys=True))
