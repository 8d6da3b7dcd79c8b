"""The trial database: schema, lifecycle, queries, migrations, bad input, concurrency, PostgreSQL."""

from __future__ import annotations

import csv
import doctest
import io
import json
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import _postgres
import pytest
import sqlalchemy as sa

from rgtune.db import database as dbmod
from rgtune.db import engine as _db_engine
from rgtune.db import liveness as _db_stale
from rgtune.db import optuna_storage as _db_optuna
from rgtune.db import records as _db_records
from rgtune.db import trial_result as _db_trial_result
from rgtune.db.engine import make_engine, parse_url
from rgtune.db.migrate import current_revision, known_revisions, migrate
from rgtune.db.schema import SCHEMA_VERSION, VERSION_TABLE, Base, Trial
from rgtune.db import (
    DatabaseCorruptError,
    DatabaseError,
    DatabaseLockedError,
    DatabaseReadOnlyError,
    DatabaseUnreachableError,
    DatabaseURLError,
    DeviceInfo,
    NotFoundError,
    SchemaVersionError,
    TrialDatabase,
    TrialStatus,
    records_to_json,
    worker_id,
    write_csv,
)

postgres_server = _postgres.postgres_server  # pytest fixtures, found by module attribute
postgres_url = _postgres.postgres_url


# ---------------------------------------------------------------------- helpers
@dataclass(frozen=True)
class _Stats:
    values: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return dict(self.values)


@dataclass(frozen=True)
class _StubGraph:
    """A graph as the database sees it, without torch (cheap in spawned worker processes)."""

    name: str = "stub"
    content_hash: str = "5eed0000aaaa1111"
    stats: _Stats = field(default_factory=lambda: _Stats({"num_nodes": 10, "num_edges": 30, "num_rels": 3, "src_pair_ratio": 0.5}))


CPU = DeviceInfo(name="test cpu", backend="cpu", architecture="x86_64", compiler="gcc 12", extra={"omp_threads": 4})


def _file_url(path: Path) -> str:
    return f"sqlite:///{path}"


def _workload(db: TrialDatabase, model: str = "rgcn", graph: Any = None, **kw: Any) -> dbmod.WorkloadRecord:
    return db.ensure_workload(model, graph or _StubGraph(), CPU, in_dim=kw.pop("in_dim", 16), out_dim=kw.pop("out_dim", 16), **kw)


def _trial(db: TrialDatabase, w: Any, knobs: dict[str, Any], status: str, ms: float | None = None, **kw: Any) -> int:
    tid = db.start_trial(w, knobs)
    db.finish_trial(tid, status, median_ms=ms, **kw)
    return tid


def _best_id(db: TrialDatabase, *args: Any, **kw: Any) -> int | None:
    rec = db.best(*args, **kw)
    return None if rec is None else rec.id


def _one_line(e: BaseException) -> str:
    msg = str(e)
    assert "\n" not in msg and msg, msg
    return msg


def _raw(url: str) -> sa.Engine:
    """A plain engine, outside TrialDatabase, to look at or tamper with the database."""
    return sa.create_engine(url)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ---------------------------------------------------------------------- docs
@pytest.mark.parametrize("module", [dbmod, _db_records, _db_engine, _db_stale, _db_trial_result, _db_optuna],
                         ids=lambda m: m.__name__)
def test_docstring_examples_run(module: Any) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


# ---------------------------------------------------------------------- basics
def test_default_url_is_results_db_in_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with TrialDatabase() as db:
        assert db.name == "results.db" and db.dialect == "sqlite"
        assert db.url == f"sqlite:///{tmp_path / 'results.db'}"  # absolute: usable after a chdir, by Optuna too
        _trial(db, _workload(db), {"a": 1}, "ok", 1.0)
    assert (tmp_path / "results.db").is_file()
    with _raw(_file_url(tmp_path / "results.db")).connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert current_revision(conn) == SCHEMA_VERSION
    # A bare file name works too; a later chdir does not move the database.
    db = TrialDatabase("other.db")
    monkeypatch.chdir(tmp_path.parent)
    _trial(db, _workload(db), {"a": 1}, "ok", 1.0)
    assert (tmp_path / "other.db").is_file() and not (tmp_path.parent / "other.db").exists()


def test_lifecycle_queries_and_get_or_create(tmp_path: Path) -> None:
    db = TrialDatabase(_file_url(tmp_path / "r.db"))
    w = _workload(db, "HGT", heads=2)
    assert w.model == "hgt" and w.heads == 2 and w.dataset == "stub" and w.device == "test cpu" and w.backend == "cpu"
    assert w.study_name.startswith("rgtune:hgt:stub:cpu:inference:")
    # get-or-create: the same things give the same ids, whatever the dict order
    assert _workload(db, "hgt", heads=2).id == w.id
    assert db.ensure_device(CPU) == db.ensure_device({"compiler": "gcc 12", "backend": "cpu", "device": "test cpu", "architecture": "x86_64", "omp_threads": 4})
    assert db.ensure_graph(_StubGraph()) == db.ensure_graph(_StubGraph(name="renamed"))  # keyed by content
    assert _workload(db, "hgt", heads=1).id != w.id
    assert _workload(db, "hgt", heads=2, mode="training").id != w.id

    t1 = db.start_trial(w, {"tile": 32, "fuse": True}, optuna_trial=0, predicted_ms=2.0, source_hash="abc")
    # committed at once: another connection sees it running
    other = TrialDatabase(_file_url(tmp_path / "r.db"))
    rec = other.trial(t1)
    assert rec.status == "running" and rec.worker == worker_id() and rec.finished_at is None and rec.predicted_ms == 2.0
    db.finish_trial(t1, TrialStatus.OK, median_ms=1.5, times_ms=[1.4, 1.5, 1.6], compile_s=0.25, max_error=1e-7)
    t2 = _trial(db, w, {"fuse": False, "tile": 64}, "ok", 0.75)
    t3 = _trial(db, w, {"tile": 16, "fuse": True}, "compile_error", error="nvrtc: error")
    rec = other.trial(t1)
    assert rec.status == "ok" and rec.times_ms == [1.4, 1.5, 1.6] and rec.compile_s == 0.25 and rec.knobs == {"fuse": True, "tile": 32}
    assert rec.source_hash == "abc" and rec.optuna_trial == 0 and rec.finished_at is not None and rec.rgtune_version

    assert _best_id(other, w) == t2
    assert _best_id(other, model="hgt", dataset="stub", heads=2) == t2
    assert other.best(model="rgat") is None
    assert [r.id for r in other.history(w)] == [t1, t2, t3]
    assert [r.id for r in other.history(w, order="newest", limit=2)] == [t3, t2]
    assert [r.id for r in other.history(w, order="fastest")] == [t2, t1, t3]
    assert [r.id for r in other.history(w, status=["ok"])] == [t1, t2]
    assert other.count_trials() == 3 and other.count_trials(w, status="ok") == 2 and other.count_trials(model="rgcn") == 0
    (ws,) = other.workloads(model="hgt", heads=2, mode="inference")
    assert (ws.num_trials, ws.num_ok, ws.best_ms) == (3, 2, 0.75)
    assert len(other.workloads()) == 3
    with pytest.raises(TypeError, match="unknown filter"):
        other.best(dataset_name="stub")  # type: ignore[call-arg]


def test_export_json_and_csv(tmp_path: Path) -> None:
    db = TrialDatabase("sqlite://")
    w = _workload(db)
    _trial(db, w, {"b": [1, 2], "a": "x"}, "ok", 1.0, times_ms=[1.0, 1.1])
    rows = db.history(w)
    data = json.loads(records_to_json(rows))
    assert data[0]["knobs"] == {"a": "x", "b": [1, 2]} and data[0]["status"] == "ok"
    assert datetime.fromisoformat(data[0]["started_at"]) <= datetime.fromisoformat(data[0]["finished_at"])
    buf = io.StringIO()
    write_csv(rows, buf)
    (row,) = list(csv.DictReader(io.StringIO(buf.getvalue())))
    assert json.loads(row["knobs"]) == {"a": "x", "b": [1, 2]} and json.loads(row["times_ms"]) == [1.0, 1.1]
    assert row["error"] == "" and float(row["median_ms"]) == 1.0
    assert json.loads(records_to_json(db.workloads()))[0]["num_ok"] == 1


def test_only_ok_can_be_best() -> None:
    db = TrialDatabase("sqlite://")
    w = _workload(db)
    for st in ("wrong_result", "invalid", "runtime_error", "timeout", "pruned", "failed", "compile_error"):
        _trial(db, w, {"s": st}, st, 0.001, max_error=float("nan"))
    db.start_trial(w, {"s": "running"})
    assert db.best(w) is None
    ok = _trial(db, w, {"s": "ok"}, "ok", 5.0)
    assert _best_id(db, w) == ok
    assert db.trial(ok - 1).max_error is None  # NaN of a failed kernel stored as NULL
    t = db.start_trial(w, {"s": "x"})
    with pytest.raises(ValueError, match="finite median_ms"):
        db.finish_trial(t, "ok")
    with pytest.raises(ValueError, match="finite"):
        db.finish_trial(t, "ok", median_ms=float("nan"))
    with pytest.raises(ValueError, match="unknown trial status"):
        db.finish_trial(t, "great")
    with pytest.raises(ValueError, match="final status"):
        db.finish_trial(t, "running")
    with pytest.raises(NotFoundError):
        db.finish_trial(10_000, "failed")
    with pytest.raises(NotFoundError):
        db.start_trial(10_000, {"a": 1})
    assert db.trial(t).status == "running"  # refused calls changed nothing



def _check_confirmation_decides_the_best(db: TrialDatabase) -> None:
    w = _workload(db, model="rgat")  # a workload of its own in a database that may hold others
    lucky = _trial(db, w, {"s": "lucky"}, "ok", 1.0)  # one fast measurement
    _trial(db, w, {"s": "steady"}, "ok", 1.1)
    assert _best_id(db, w) == lucky
    c = db.start_confirmation(w, schedules=2, rounds=3)
    rounds = {"lucky": [1.6, 1.4, 1.5], "steady": [1.2, 1.1, 1.3]}
    ids = {}
    for r in range(3):
        for name, times in rounds.items():
            ids[name, r] = tid = db.start_trial(w, {"s": name}, confirmation_id=c)
            db.finish_trial(tid, "ok", median_ms=times[r])
    _trial(db, w, {"s": "lucky"}, "wrong_result", 0.1, max_error=1.0)  # never counts
    assert _best_id(db, w) == lucky  # an unfinished (e.g. interrupted) confirmation is ignored
    db.finish_confirmation(c)
    best = db.best(w)
    assert best is not None and best.knobs == {"s": "steady"} and best.confirmation_id == c
    assert (best.id, best.median_ms) == (ids["steady", 0], 1.2)  # the middle round: the median
    assert _best_id(db, model="rgat") == best.id  # through filters too
    _trial(db, w, {"s": "later"}, "ok", 1.25)  # a later trial of the search, slower than the median
    assert _best_id(db, w) == best.id
    newer = _trial(db, w, {"s": "newer"}, "ok", 0.9)  # faster than the confirmed median: not confirmed yet
    assert _best_id(db, w) == newer and db.trial(newer).confirmation_id is None
    assert db.confirmed_best(w).id == best.id  # what the next confirmation must include
    rec = db.confirmation(c)
    assert (rec.workload_id, rec.schedules, rec.rounds, rec.finished_at is not None) == (w.id, 2, 3, True)
    with pytest.raises(NotFoundError, match="no confirmation"):
        db.finish_confirmation(10_000)
    with pytest.raises(NotFoundError, match="no confirmation"):
        db.start_trial(w, {"s": "x"}, confirmation_id=10_000)
    with pytest.raises(ValueError, match="rounds must be a positive integer"):
        db.start_confirmation(w, schedules=2, rounds=0)


def test_a_finished_confirmation_decides_the_best() -> None:
    _check_confirmation_decides_the_best(TrialDatabase("sqlite://"))

def test_schedule_knobs_are_canonical() -> None:
    np = pytest.importorskip("numpy")
    db = TrialDatabase("sqlite://")
    a = db.ensure_schedule({"tile": 32, "order": ("dst", "src"), "fuse": True})
    assert db.ensure_schedule({"fuse": True, "order": ["dst", "src"], "tile": np.int64(32)}) == a
    assert db.ensure_schedule({"fuse": True, "order": ["dst", "src"], "tile": 64}) != a
    with pytest.raises(ValueError, match="JSON"):
        db.ensure_schedule({"x": float("inf")})
    with pytest.raises(TypeError):
        db.ensure_schedule({"x": object()})


def test_long_error_messages_are_clipped() -> None:
    db = TrialDatabase("sqlite://")
    t = db.start_trial(_workload(db), {"a": 1})
    db.finish_trial(t, "compile_error", error="x" * 100_000 + "LAST")
    err = db.trial(t).error or ""
    assert len(err) < 20_000 and err.endswith("LAST") and "characters cut" in err


def test_heartbeat() -> None:
    db = TrialDatabase("sqlite://")
    t = db.start_trial(_workload(db), {"a": 1})
    before = db.trial(t).heartbeat_at
    time.sleep(0.01)
    assert db.heartbeat(t) is True
    after = db.trial(t).heartbeat_at
    assert before is not None and after is not None and after > before
    db.finish_trial(t, "timeout")
    assert db.heartbeat(t) is False


# ---------------------------------------------------------------------- stale running trials
def _running_trial(db: TrialDatabase, w: Any, worker: str | None, started: datetime, beat: datetime | None) -> int:
    tid = db.start_trial(w, {"w": str(worker), "t": started.isoformat()}, worker=worker or "x:1")
    with db.session(write=True) as s:
        s.execute(sa.update(Trial).where(Trial.id == tid).values(worker=worker, started_at=started, heartbeat_at=beat))
    return tid


def test_mark_stale_running_rule() -> None:
    db = TrialDatabase("sqlite://")
    w = _workload(db)
    other = _workload(db, "rgat")
    host = socket.gethostname()
    now = datetime.now(UTC).replace(tzinfo=None)
    old = now - timedelta(hours=2)
    dead_local = _running_trial(db, w, f"{host}:{_dead_pid()}", now, now)
    live_local = _running_trial(db, w, f"{host}:{os.getppid()}", now, old)  # alive, however old its heartbeat
    mine = _running_trial(db, w, worker_id(), now, old)
    # pid exists (it is us) but the process started after the trial: the pid was reused
    reused = _running_trial(db, w, worker_id(), now - timedelta(days=30), None)
    remote_fresh = _running_trial(db, w, "elsewhere:123", old, now - timedelta(seconds=10))
    remote_silent = _running_trial(db, w, "elsewhere:124", old, old)
    unknown_old = _running_trial(db, w, None, old, None)  # e.g. a row from schema 0001
    other_workload = _running_trial(db, other, f"{host}:{_dead_pid()}", now, now)
    done = _trial(db, w, {"done": 1}, "ok", 1.0)

    marked = db.mark_stale_running(w, stale_after=600)
    assert sorted(marked) == sorted([dead_local, reused, remote_silent, unknown_old])
    for tid in marked:
        rec = db.trial(tid)
        assert rec.status == "failed" and rec.error and rec.error.startswith("abandoned") and rec.finished_at
    for tid in (live_local, mine, remote_fresh, other_workload):
        assert db.trial(tid).status == "running"
    assert db.trial(done).status == "ok"
    assert db.mark_stale_running(w, stale_after=600) == []
    assert db.mark_stale_running(stale_after=600) == [other_workload]
    # A worker that was alive after all finishes its trial: its measurement wins.
    db.finish_trial(remote_silent, "ok", median_ms=3.0)
    assert _best_id(db, w) == done and db.trial(remote_silent).status == "ok"


_KILLED_WORKER = """
    import sys, time
    from rgtune.db import TrialDatabase, DeviceInfo
    db = TrialDatabase(sys.argv[1])
    w = db.ensure_workload("rgcn", int(sys.argv[2]), int(sys.argv[3]), in_dim=16, out_dim=16)
    print(db.start_trial(w, {"doomed": True}), flush=True)
    time.sleep(600)
"""


def test_kill_9_mid_trial_then_resume(tmp_path: Path) -> None:
    path = tmp_path / "results.db"
    db = TrialDatabase(_file_url(path))
    w = _workload(db)
    done = _trial(db, w, {"a": 1}, "ok", 1.0)
    args = [_file_url(path), str(db.ensure_graph(_StubGraph())), str(db.ensure_device(CPU))]
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_KILLED_WORKER), *args], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        doomed = int(proc.stdout.readline())
    finally:
        proc.kill()  # SIGKILL: no cleanup of any kind
        proc.wait()
    assert db.trial(doomed).status == "running"  # committed before the kill
    resumed = TrialDatabase(_file_url(path))
    assert resumed.mark_stale_running(w) == [doomed]
    assert resumed.trial(doomed).status == "failed" and _best_id(resumed, w) == done
    with resumed.session() as s:
        assert s.execute(sa.text("PRAGMA integrity_check")).scalar() == "ok"


# ---------------------------------------------------------------------- migrations
def _make_0001_database(url: str) -> None:
    """A database as rgtune with schema 0001 left it: one workload with four trials, one still running."""
    engine = make_engine(parse_url(url), readonly=False, busy_timeout=5)
    migrate(engine.execution_options(rgtune_write=True), "0001")
    t0 = datetime(2025, 2, 1, 12, 0, 0)
    with engine.begin() as conn:
        md = sa.MetaData()
        md.reflect(conn)
        tb = md.tables
        conn.execute(tb["rg_devices"].insert(), [dict(fingerprint="f" * 64, name="old gpu", architecture="sm_80", runtime="cuda 12.1", compiler="nvrtc 12.1", backend="cuda", extra={"sms": 108}, created_at=t0)])
        conn.execute(tb["rg_graphs"].insert(), [dict(content_hash="aifbhash", name="aifb", stats={"num_nodes": 8285}, num_nodes=8285, num_edges=58086, num_rels=104, created_at=t0)])
        conn.execute(tb["rg_schedules"].insert(), [dict(hash=f"h{i}", knobs={"tile": 16 * i}, created_at=t0) for i in (1, 2, 3)])
        conn.execute(tb["rg_workloads"].insert(), [dict(model="hgt", in_dim=64, out_dim=64, heads=1, graph_id=1, device_id=1, backend="cuda", mode="inference", study_name="old-study", created_at=t0)])
        base = dict(workload_id=1, optuna_trial=None, times_ms=None, compile_s=None, max_error=None, source_hash=None, rgtune_version="0.0.9", error=None, finished_at=t0)
        conn.execute(
            tb["rg_trials"].insert(),
            [
                {**base, "schedule_id": 1, "status": "ok", "median_ms": 2.5, "times_ms": [2.4, 2.5], "started_at": t0, "host": "gpu-box", "pid": 4242},
                {**base, "schedule_id": 2, "status": "ok", "median_ms": 1.5, "started_at": t0, "host": "gpu-box", "pid": 4242},
                {**base, "schedule_id": 3, "status": "wrong_result", "median_ms": 0.5, "error": "max err", "started_at": t0, "host": None, "pid": None},
                {**base, "schedule_id": 3, "status": "running", "median_ms": None, "started_at": t0, "finished_at": None, "host": "gpu-box", "pid": 4243},
            ],
        )
    engine.dispose()


def _check_upgraded_0001_data(db: TrialDatabase) -> None:
    assert db.schema_version == SCHEMA_VERSION
    assert db.count_trials() == 4 and db.count_trials(status="ok") == 2
    best = db.best(model="hgt", dataset="aifb")
    assert best is not None and best.id == 2 and best.median_ms == 1.5 and best.knobs == {"tile": 32} and best.device == "old gpu"
    assert db.trial(1).worker == "gpu-box:4242" and db.trial(1).times_ms == [2.4, 2.5] and db.trial(3).worker is None
    assert db.trial(1).predicted_ms is None and db.trial(1).heartbeat_at is None
    (w,) = db.workloads()
    assert w.study_name == "old-study" and w.num_trials == 4
    # the old running trial (no heartbeat, started long ago on a host that is not this one) is abandoned
    assert db.mark_stale_running(w, stale_after=60) == [4]
    new = db.start_trial(w, {"tile": 48}, predicted_ms=1.0)
    db.finish_trial(new, "ok", median_ms=1.0)
    assert _best_id(db, w) == new
    # rows from before model options read as "no options"; the same model with options is another workload
    assert w.options == "" and db.best(model="hgt", options="") is not None
    assert db.best(model="hgt", options="num_bases=2") is None
    # rows from before samplers read as tuned on the whole graph; a sampler's is another workload
    assert w.batches == "" and db.best(model="hgt", batches="") is not None
    assert db.best(model="hgt", batches=_BATCHES) is None


_COMPARE_OPTS = {
    "compare_type": True,
    "include_name": lambda name, type_, parents: type_ != "table" or (name.startswith("rg_") and name != VERSION_TABLE),
}


def test_head_revision_matches_models() -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    assert known_revisions() == ["0001", "0002", "0003", "0004", "0005", "0006", "0007", "0008"] and known_revisions()[-1] == SCHEMA_VERSION
    db = TrialDatabase("sqlite://")
    with db.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts=_COMPARE_OPTS)
        assert compare_metadata(ctx, Base.metadata) == []


def test_upgrade_from_0001_keeps_data(tmp_path: Path) -> None:
    path = tmp_path / "results.db"
    _make_0001_database(_file_url(path))
    with _raw(_file_url(path)).connect() as conn:
        assert current_revision(conn) == "0001"
        assert "host" in {c["name"] for c in sa.inspect(conn).get_columns("rg_trials")}
    _check_upgraded_0001_data(TrialDatabase(_file_url(path)))
    with _raw(_file_url(path)).connect() as conn:  # upgraded in place, recorded
        assert conn.exec_driver_sql(f"SELECT version_num FROM {VERSION_TABLE}").scalar() == SCHEMA_VERSION
        cols = {c["name"] for c in sa.inspect(conn).get_columns("rg_trials")}
        assert {"worker", "heartbeat_at", "predicted_ms", "confirmation_id"} <= cols and not {"host", "pid"} & cols
        assert "rg_confirmations" in sa.inspect(conn).get_table_names()
        assert "ix_rg_trials_workload_status_median" in {i["name"] for i in sa.inspect(conn).get_indexes("rg_trials")}


def test_downgrade_and_upgrade_again_keep_data(tmp_path: Path) -> None:
    url = _file_url(tmp_path / "r.db")
    _make_0001_database(url)
    TrialDatabase(url).close()
    engine = make_engine(parse_url(url), readonly=False, busy_timeout=5)
    migrate(engine.execution_options(rgtune_write=True), "0001")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT host, pid FROM rg_trials WHERE id = 1").one() == ("gpu-box", 4242)
    engine.dispose()
    _check_upgraded_0001_data(TrialDatabase(url))


def test_upgrade_refused_when_disabled(tmp_path: Path) -> None:
    url = _file_url(tmp_path / "r.db")
    _make_0001_database(url)
    with pytest.raises(SchemaVersionError, match="older"):
        TrialDatabase(url, upgrade=False)
    with pytest.raises(SchemaVersionError, match="older"):
        TrialDatabase(url, readonly=True)


def test_model_options_are_part_of_the_workload_key(tmp_path: Path) -> None:
    db = TrialDatabase(_file_url(tmp_path / "r.db"))
    plain, bases, again = _workload(db), _workload(db, options="num_bases=4"), _workload(db, options="num_bases=4")
    assert plain.id != bases.id == again.id and (plain.options, bases.options) == ("", "num_bases=4")
    assert plain.study_name != bases.study_name
    _trial(db, bases, {"a": 1}, "ok", 2.0)
    assert db.best(model="rgcn", options="num_bases=4").options == "num_bases=4"  # type: ignore[union-attr]
    assert db.best(model="rgcn", options="") is None
    with pytest.raises(ValueError, match="canonical text"):
        _workload(db, options={"num_bases": 4})  # type: ignore[arg-type]
    db.close()


def test_downgrade_below_options_refuses_when_options_are_used(tmp_path: Path) -> None:
    url = _file_url(tmp_path / "r.db")
    db = TrialDatabase(url)
    _workload(db, options="num_bases=4")
    db.close()
    engine = make_engine(parse_url(url), readonly=False, busy_timeout=5)
    with pytest.raises(Exception, match="have model options"):
        migrate(engine.execution_options(rgtune_write=True), "0004")
    engine.dispose()
    assert TrialDatabase(url).workloads()[0].options == "num_bases=4"  # rolled back, untouched


_BATCHES = "neighbor:fanout=15x10,batch_size=1024"


def test_upgrade_from_0006_reads_whole_graph_batches(tmp_path: Path) -> None:
    url = _file_url(tmp_path / "r.db")
    _make_0001_database(url)
    engine = make_engine(parse_url(url), readonly=False, busy_timeout=5)
    migrate(engine.execution_options(rgtune_write=True), "0006")
    with engine.connect() as conn:
        assert current_revision(conn) == "0006" and "batches" not in {c["name"] for c in sa.inspect(conn).get_columns("rg_workloads")}
    engine.dispose()
    db = TrialDatabase(url)
    (w,) = db.workloads()
    assert db.schema_version == SCHEMA_VERSION and w.batches == "" and w.study_name == "old-study"
    assert {t.batches for t in db.history(w)} == {""}
    db.close()


def test_upgrade_from_0007_reads_float32_workloads(tmp_path: Path) -> None:
    url = _file_url(tmp_path / "r.db")
    _make_0001_database(url)
    engine = make_engine(parse_url(url), readonly=False, busy_timeout=5)
    migrate(engine.execution_options(rgtune_write=True), "0007")
    with engine.connect() as conn:
        assert "precision" not in {c["name"] for c in sa.inspect(conn).get_columns("rg_workloads")}
    engine.dispose()
    db = TrialDatabase(url)
    (w,) = db.workloads()
    assert db.schema_version == SCHEMA_VERSION and w.precision == "fp32" and w.study_name == "old-study"
    assert {t.precision for t in db.history(w)} == {"fp32"}
    db.close()


def test_the_precision_policy_is_part_of_the_workload_key(tmp_path: Path) -> None:
    db = TrialDatabase(_file_url(tmp_path / "r.db"))
    plain, low, again = _workload(db), _workload(db, precision="bf16"), _workload(db, precision="bf16")
    assert plain.id != low.id == again.id and (plain.precision, low.precision) == ("fp32", "bf16")
    # the float32 study keeps the name it had before the policy existed: Optuna finds it by name
    assert plain.study_name == "rgtune:rgcn:stub:cpu:inference:08ef467b993e" != low.study_name
    _trial(db, plain, {"precision.edges": "float32"}, "ok", 2.0)
    _trial(db, low, {"precision.edges": "bfloat16"}, "ok", 1.0)
    assert [w.id for w in db.workloads(precision="bf16")] == [low.id]
    best = db.best(model="rgcn", precision="fp32")
    assert best is not None and best.precision == "fp32" and best.knobs == {"precision.edges": "float32"}
    with pytest.raises(ValueError, match="unknown precision 'half'; choose one of"):
        _workload(db, precision="half")
    db.close()


def test_batches_are_part_of_the_workload_key(tmp_path: Path) -> None:
    db = TrialDatabase(_file_url(tmp_path / "r.db"))
    plain, sampled, again = _workload(db), _workload(db, batches=_BATCHES), _workload(db, batches=_BATCHES)
    assert plain.id != sampled.id == again.id and (plain.batches, sampled.batches) == ("", _BATCHES)
    assert _workload(db, batches="").id == plain.id
    # the whole graph's study keeps the name rgtune gave it before batches existed: Optuna finds it by name
    assert plain.study_name == "rgtune:rgcn:stub:cpu:inference:08ef467b993e" != sampled.study_name
    assert _workload(db, options="num_bases=4", batches=_BATCHES).study_name not in (plain.study_name, sampled.study_name)
    _trial(db, plain, {"a": 1}, "ok", 1.0)
    _trial(db, sampled, {"a": 2}, "ok", 2.0)
    assert [w.id for w in db.workloads(batches=_BATCHES, options="")] == [sampled.id]
    assert [w.id for w in db.workloads(batches="", options="")] == [plain.id]
    assert [t.knobs for t in db.history(batches=_BATCHES)] == [{"a": 2}] and db.count_trials(batches="") == 1
    best = db.best(model="rgcn", batches=_BATCHES)
    assert best is not None and best.batches == _BATCHES and best.median_ms == 2.0
    assert db.best(model="rgcn", batches="neighbor:fanout=5,batch_size=64") is None
    with pytest.raises(ValueError, match="batches"):
        _workload(db, batches="x" * 256)
    with pytest.raises(ValueError, match="batches"):
        _workload(db, batches={"fanout": [15, 10]})  # type: ignore[arg-type]
    db.close()


def test_downgrade_below_batches_refuses_while_a_workload_has_them(tmp_path: Path) -> None:
    url = _file_url(tmp_path / "r.db")
    db = TrialDatabase(url)
    _workload(db)
    _trial(db, _workload(db, batches=_BATCHES), {"a": 1}, "ok", 1.0)
    db.close()
    engine = make_engine(parse_url(url), readonly=False, busy_timeout=5)
    with pytest.raises(Exception, match="1 workload.*mini-batches"):
        migrate(engine.execution_options(rgtune_write=True), "0006")
    with TrialDatabase(url) as db:
        assert db.workloads()[1].batches == _BATCHES  # rolled back, untouched
    with engine.begin() as conn:  # without it, the older schema can hold the rest
        conn.exec_driver_sql("DELETE FROM rg_trials")
        conn.exec_driver_sql("DELETE FROM rg_workloads WHERE batches <> ''")
    migrate(engine.execution_options(rgtune_write=True), "0006")
    with engine.connect() as conn:
        assert current_revision(conn) == "0006" and "batches" not in {c["name"] for c in sa.inspect(conn).get_columns("rg_workloads")}
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM rg_workloads").scalar() == 1
        (key,) = [u["column_names"] for u in sa.inspect(conn).get_unique_constraints("rg_workloads") if u["name"] == "uq_rg_workloads_key"]
        assert key[-1] == "options"  # the 0006 key again
    engine.dispose()
    with TrialDatabase(url) as db:
        (w,) = db.workloads()
        assert w.batches == ""


@pytest.mark.parametrize("version, pattern", [(f"{int(SCHEMA_VERSION) + 1:04d}", "newer than this rgtune knows"), ("zz99", "does not know")])
def test_newer_or_unknown_schema_is_refused_untouched(tmp_path: Path, version: str, pattern: str) -> None:
    path = tmp_path / "results.db"
    db = TrialDatabase(_file_url(path))
    _trial(db, _workload(db), {"a": 1}, "ok", 1.0)
    db.close()
    with _raw(_file_url(path)).begin() as conn:
        conn.exec_driver_sql(f"UPDATE {VERSION_TABLE} SET version_num = '{version}'")
    before = path.read_bytes()
    with pytest.raises(SchemaVersionError, match=pattern) as info:
        TrialDatabase(_file_url(path))
    assert version in _one_line(info.value) and "results.db" in str(info.value)
    with pytest.raises(SchemaVersionError, match=pattern):
        TrialDatabase(_file_url(path), readonly=True)
    assert path.read_bytes() == before


@pytest.mark.slow
def test_concurrent_first_open_migrates_once(tmp_path: Path) -> None:
    """Several processes opening one fresh file at once: one migrates, the others wait and see head."""
    url = _file_url(tmp_path / "fresh.db")
    _run_workers(_open_worker, [(url,)] * 3)
    with _raw(url).connect() as conn:
        assert list(conn.exec_driver_sql(f"SELECT version_num FROM {VERSION_TABLE}").scalars()) == [SCHEMA_VERSION]


def _open_worker(url: str) -> None:
    TrialDatabase(url).close()


# ---------------------------------------------------------------------- read-only mode
def test_readonly_mode(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    db = TrialDatabase(_file_url(path))
    t = _trial(db, _workload(db), {"a": 1}, "ok", 1.0)
    db.close()
    before = path.read_bytes()
    ro = TrialDatabase(_file_url(path), readonly=True)
    assert _best_id(ro, model="rgcn") == t and ro.count_trials() == 1 and "read-only" in repr(ro)
    with pytest.raises(DatabaseReadOnlyError, match="read-only"):
        ro.start_trial(1, {"a": 1})
    with pytest.raises(DatabaseReadOnlyError):
        ro.ensure_schedule({"new": 1})
    assert path.read_bytes() == before
    with pytest.raises(DatabaseURLError, match="does not exist"):
        TrialDatabase(_file_url(tmp_path / "missing.db"), readonly=True)
    assert not (tmp_path / "missing.db").exists()


# ---------------------------------------------------------------------- Optuna in the same database
def _optuna_round(url: str, n: int) -> int:
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(study_name="rgtune:test", storage=storage, load_if_exists=True)
    study.optimize(lambda tr: (tr.suggest_int("x", 0, 10) - 3) ** 2, n_trials=n)
    storage.remove_session()
    storage.engine.dispose()
    return len(study.trials)


@pytest.mark.parametrize("optuna_first", [False, True])
def test_optuna_storage_shares_the_database(tmp_path: Path, optuna_first: bool) -> None:
    url = _file_url(tmp_path / "results.db")
    if optuna_first:
        assert _optuna_round(url, 3) == 3
    db = TrialDatabase(url)
    _trial(db, _workload(db), {"a": 1}, "ok", 1.0)
    assert _optuna_round(url, 3) == (6 if optuna_first else 3)
    db.close()
    db = TrialDatabase(url)
    assert db.count_trials() == 1 and db.schema_version == SCHEMA_VERSION
    with _raw(url).connect() as conn:
        names = set(sa.inspect(conn).get_table_names())
    assert {"studies", "trials", "alembic_version", "rg_trials", VERSION_TABLE} <= names


# ---------------------------------------------------------------------- Optuna's private tables, one adapter
ROOT = Path(__file__).resolve().parents[1]


def test_the_optuna_private_models_have_what_the_adapter_uses() -> None:
    """Fails loudly when a new Optuna changes the private models that correct_finished_trials writes with."""
    _db_optuna.check_private_models()


def test_pyproject_pins_optuna_to_the_versions_the_adapter_was_verified_with() -> None:
    from importlib.metadata import version

    low, high = _db_optuna.VERIFIED_OPTUNA
    assert f'"optuna>={low},<{high}"' in (ROOT / "pyproject.toml").read_text()
    installed = tuple(int(p) for p in version("optuna").split(".")[:2])
    assert tuple(map(int, low.split("."))) <= installed < tuple(map(int, high.split("."))), (
        f"optuna {version('optuna')} is installed; the adapter was verified with optuna>={low},<{high}: run "
        "this file's Optuna tests, then widen VERIFIED_OPTUNA and pyproject together")


def test_nothing_but_the_adapter_reaches_below_optunas_public_api() -> None:
    private = ("optuna.storages._", "._storage", "._trial_id", "._study_id", "_rdb")
    adapter = ROOT / "rgtune" / "db" / "optuna_storage.py"
    found = [f"{p.relative_to(ROOT)}: {needle}" for p in sorted((ROOT / "rgtune").rglob("*.py")) if p != adapter
             for needle in private if needle in p.read_text()]
    assert found == []


def test_correcting_finished_trials_changes_their_values_and_states(tmp_path: Path) -> None:
    optuna = pytest.importorskip("optuna")
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    db = TrialDatabase(_file_url(tmp_path / "results.db"))
    study = optuna.create_study(study_name="s", storage=db.optuna_storage())
    other = optuna.create_study(study_name="other", storage=db.optuna_storage())
    for s in (study, other):
        for value in (3.0, 2.0, 1.0):
            s.add_trial(optuna.trial.create_trial(value=value, params={"x": 0},
                                                  distributions={"x": optuna.distributions.IntDistribution(0, 1)}))
    db.correct_optuna_trials("s", {0: 5.0}, failed=[2])
    again = optuna.load_study(study_name="s", storage=db.url)
    assert [(t.state, t.value) for t in again.trials] == [(TrialState.COMPLETE, 5.0), (TrialState.COMPLETE, 2.0),
                                                         (TrialState.FAIL, None)]
    assert again.best_trial.number == 1
    assert [t.value for t in optuna.load_study(study_name="other", storage=db.url).trials] == [3.0, 2.0, 1.0]
    with pytest.raises(KeyError, match=r"study 's' has no trials numbered \[7\]"):
        db.correct_optuna_trials("s", {7: 1.0})


# ---------------------------------------------------------------------- typed trial results
def test_trial_details_read_back_what_they_wrote_and_an_older_rgtunes_rows() -> None:
    from rgtune.db.trial_result import Coverage, MemoryUse, PairedTiming, TrialDetails

    details = TrialDetails(verified=Coverage(16, 40, 300, 12), verify_seconds=0.5, verify_run_seconds=0.01,
                           tolerance=2e-4, first_run_ms=1.5, paired=PairedTiming(0.9, 2.0, 2.1), device_wait_s=0.3,
                           memory=MemoryUse(100, 80, 90, False, None, None), cache_hit=True,
                           build={"flags": "-O3"}, elapsed_s=1.0, measurements_ms=[1.0, 2.0], predicted_ms=1.2,
                           kernel_ms=1.4, call_ms=1.9, objective="call",
                           call_warnings=["RuntimeWarning: recording the program as a CUDA graph failed"])
    assert TrialDetails.from_json(json.loads(json.dumps(details.to_json()))) == details
    older = {"cache_hit": False, "compiled": 2, "verified": {"rows": "all"}, "memory_refused": True,
             "estimated_bytes": 5000, "timing": "paired", "vs_reference": 1.1, "reference_ms": 3.0,
             "reference_now_ms": 3.3, "elapsed": 0.7}
    read = TrialDetails.from_json(older)
    assert read.build == {"compiled": 2} and read.verified == Coverage() and read.memory.refused
    assert read.memory.recorded_bytes == 5000 and read.paired == PairedTiming(1.1, 3.0, 3.3)
    assert read.to_json() == {**{k: v for k, v in older.items() if k != "compiled"}, "build": {"compiled": 2}}


def test_a_recorded_result_is_its_columns_and_its_details(tmp_path: Path) -> None:
    from rgtune.db.trial_result import MemoryUse, TrialDetails, TrialResult

    db = TrialDatabase(_file_url(tmp_path / "results.db"))
    w = _workload(db)
    details = TrialDetails(memory=MemoryUse(peak_bytes=4096), predicted_ms=2.5, verify_seconds=0.25)
    t = db.start_trial(w, {"a": 1})
    db.record_result(t, TrialResult("ok", median=0.002, times=[0.002, 0.003], max_error=1e-7, details=details))
    rec = db.trial(t)
    assert (rec.median_ms, rec.times_ms, rec.peak_bytes, rec.predicted_ms) == (2.0, [2.0, 3.0], 4096, 2.5)
    assert rec.details == details and json.loads(records_to_json([rec]))[0]["details"] == details.to_json()
    refused = db.start_trial(w, {"a": 2})
    db.record_result(refused, TrialResult("out_of_memory", details=TrialDetails(
        memory=MemoryUse(estimated_bytes=9000, refused=True))))
    assert db.trial(refused).peak_bytes == 9000  # refused before running: its estimate
    bare = db.start_trial(w, {"a": 3})
    db.record_result(bare, TrialResult("invalid", error="no"))
    assert db.trial(bare).details is None


# ---------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "url",
    ["results", "nosuchdb://x/y", "postgresql://u@h:notaport/db", "sqlite://somehost/x.db", "://", "sqlite:results.db"],
)
def test_malformed_url(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatabaseURLError) as info:
        TrialDatabase(url)
    assert "sqlite:///" in _one_line(info.value)
    assert list(tmp_path.iterdir()) == []


def test_password_is_not_shown() -> None:
    with pytest.raises(DatabaseURLError) as info:
        TrialDatabase("postgresql://user:s3cret@host:notaport/db")
    assert "s3cret" not in str(info.value)
    assert _db_engine.display_name(parse_url("postgresql+psycopg://u:s3cret@h/db")) == "postgresql+psycopg://u:***@h/db"


def test_missing_directory_and_directory_path(tmp_path: Path) -> None:
    with pytest.raises(DatabaseURLError, match="does not exist"):
        TrialDatabase(_file_url(tmp_path / "nope" / "results.db"))
    with pytest.raises(DatabaseURLError, match="is a directory"):
        TrialDatabase(_file_url(tmp_path))
    assert not (tmp_path / "nope").exists()


def test_unreachable_postgres_closed_port() -> None:
    pytest.importorskip("psycopg")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening, closed below: nothing answers there
    start = time.monotonic()
    with pytest.raises(DatabaseUnreachableError) as info:
        TrialDatabase(f"postgresql+psycopg://rgtune:pw@127.0.0.1:{port}/rgtune")
    msg = _one_line(info.value)
    assert msg.startswith("cannot connect to postgresql+psycopg://rgtune:***@127.0.0.1") and "pw@" not in msg
    assert time.monotonic() - start < 15


def test_corrupt_file_is_refused_untouched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    junk = os.urandom(8192)
    Path("results.db").write_bytes(junk)
    with pytest.raises(DatabaseCorruptError) as info:
        TrialDatabase()
    msg = _one_line(info.value)
    assert "results.db" in msg and "file is not a database" in msg and "mv results.db results.db.bad" in msg
    assert Path("results.db").read_bytes() == junk and sorted(os.listdir()) == ["results.db"]


def test_damaged_pages_are_reported_as_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "results.db"
    db = TrialDatabase(_file_url(path))
    w = _workload(db)
    for i in range(50):
        _trial(db, w, {"i": i, "pad": "x" * 500}, "ok", float(i + 1))
    db.close()
    data = bytearray(path.read_bytes())
    data[100:] = os.urandom(len(data) - 100)  # header intact, every page garbage
    path.write_bytes(bytes(data))
    with pytest.raises(DatabaseCorruptError, match="move it away"):
        TrialDatabase(_file_url(path)).count_trials()


def test_a_writer_refuses_damaged_pages_before_writing_anything(tmp_path: Path) -> None:
    """Pages damaged past the header: a writer (tune) is refused when it opens the file, which stays
    byte-identical (before, tune added a workload, a study and a waiting trial to the pages that still read)."""
    path = tmp_path / "results.db"
    db = TrialDatabase(_file_url(path))
    w = _workload(db)
    for i in range(50):
        _trial(db, w, {"i": i, "pad": "x" * 500}, "ok", float(i + 1))
    db.close()
    data = bytearray(path.read_bytes())
    page = 4096
    data[3 * page:] = os.urandom(len(data) - 3 * page)  # the schema's first pages intact, the trials' garbage
    path.write_bytes(bytes(data))
    before = path.read_bytes()
    with pytest.raises(DatabaseCorruptError, match="is damaged .*nothing was written to it"):
        TrialDatabase(_file_url(path))
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["results.db"]


def _run_unprivileged(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run Python code where file permissions apply: root ignores them unless it drops CAP_DAC_OVERRIDE."""
    cmd = [sys.executable, "-c", textwrap.dedent(code)]
    if os.name == "posix" and os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv: file permissions cannot be made to apply")
        caps = "-dac_override,-dac_read_search"
        cmd = ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}", "--", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd, check=False)
    if "setpriv:" in proc.stderr:
        pytest.skip(f"setpriv cannot drop capabilities here: {proc.stderr.strip()}")
    return proc


_OPEN_AND_WRITE = """
    import sys
    from rgtune.db import TrialDatabase, DatabaseReadOnlyError, DeviceInfo
    try:
        db = TrialDatabase(sys.argv[1] if len(sys.argv) > 1 else "results.db")
        db.ensure_schedule({"new": 1})
    except DatabaseReadOnlyError as e:
        print("READONLY", e)
    else:
        print("WROTE")
"""


def test_readonly_file_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "results.db"
    db = TrialDatabase(_file_url(path))
    _trial(db, _workload(db), {"a": 1}, "ok", 1.0)
    db.close()
    before = path.read_bytes()
    path.chmod(0o444)
    try:
        proc = _run_unprivileged(_OPEN_AND_WRITE, tmp_path)
    finally:
        path.chmod(0o644)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.strip()
    assert out.startswith("READONLY cannot write to results.db") and "read-only" in out and len(out.splitlines()) == 1
    assert path.read_bytes() == before


@pytest.mark.parametrize("existing", [True, False])
def test_readonly_directory_is_refused(tmp_path: Path, existing: bool) -> None:
    d = tmp_path / "ro"
    d.mkdir()
    if existing:
        db = TrialDatabase(_file_url(d / "results.db"))
        _trial(db, _workload(db), {"a": 1}, "ok", 1.0)
        db.close()
    listing = sorted(os.listdir(d))
    d.chmod(0o555)
    try:
        proc = _run_unprivileged(_OPEN_AND_WRITE, d)
    finally:
        d.chmod(0o755)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.strip()
    assert out.startswith("READONLY cannot") and "read-only" in out and len(out.splitlines()) == 1, out
    assert sorted(os.listdir(d)) == listing


def test_locked_database_gives_up_with_a_pointer_to_postgres(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "results.db"
    db = TrialDatabase(_file_url(path), busy_timeout=0.1, retries=1)
    w = _workload(db)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holding the write lock for a long time
    try:
        with pytest.raises(DatabaseLockedError) as info:
            db.start_trial(w, {"a": 1})
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    msg = _one_line(info.value)
    assert "results.db" in msg and "locked" in msg and "postgresql" in msg.lower()
    assert db.count_trials() == 0
    db.start_trial(w, {"a": 1})  # the lock is gone: it works again


def test_driver_errors_never_escape() -> None:
    db = TrialDatabase("sqlite://")
    with db.session(write=True) as s:
        s.execute(sa.text("DROP TABLE rg_trials"))
    with pytest.raises(DatabaseError) as info:
        db.count_trials()
    assert "no such table" in _one_line(info.value)


# ---------------------------------------------------------------------- two processes, one database
def _run_workers(target: Callable[..., None], args: list[tuple[Any, ...]], timeout: float = 120) -> None:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=a) for a in args]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    for p in procs:
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [0] * len(procs)


def test_a_trial_is_named_by_its_number_in_its_study(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Record ids count across the database; a study numbers its own trials from 0 (as optuna-dashboard shows
    them), and a confirmation round is named by its schedule's search trial."""
    from rgtune.cli import main

    db = TrialDatabase(_file_url(tmp_path / "r.db"))
    first, second = _workload(db, "hgt"), _workload(db, "rgcn")
    for i in range(5):  # the first study's trials take the first record ids
        db.finish_trial(db.start_trial(first, {"i": i}, optuna_trial=i), "ok", median_ms=5.0 + i)
    searched = [db.start_trial(second, {"i": i}, optuna_trial=i) for i in range(3)]
    for i, tid in enumerate(searched):
        db.finish_trial(tid, "ok", median_ms=3.0 - i)
    c = db.start_confirmation(second, schedules=1, rounds=1)
    rnd = db.start_trial(second, {"i": 2}, confirmation_id=c)
    db.finish_trial(rnd, "ok", median_ms=0.5)
    db.finish_confirmation(c)
    outside = db.start_trial(second, {"i": 99})  # measured outside the search (no study number)
    db.finish_trial(outside, "ok", median_ms=9.0)
    assert [db.study_trial_number(db.trial(t)) for t in (*searched, rnd, outside)] == [0, 1, 2, 2, None]
    best = db.best(second)
    assert best is not None and best.id == rnd and best.id > 5
    db.close()
    assert main(["best", "--model", "rgcn", "--db", _file_url(tmp_path / "r.db")]) == 0
    assert capsys.readouterr().out.startswith(f"best: trial 2 of the study (record #{rnd}), 0.5 ms")
    assert main(["history", "--model", "rgcn", "--db", _file_url(tmp_path / "r.db")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["trial", "record"]
    assert [ln.split()[:2] for ln in lines[1:]] == [["0", f"#{searched[0]}"], ["1", f"#{searched[1]}"],
                                                   ["2", f"#{searched[2]}"], ["-", f"#{rnd}"], ["-", f"#{outside}"]]


def _trial_writer(url: str, tag: str, n: int, barrier: Any) -> None:
    # Both open the database at once (racing to create it), then write at once.
    barrier.wait()
    db = TrialDatabase(url)
    w = db.ensure_workload("rgcn", _StubGraph(), CPU, in_dim=16, out_dim=16)
    barrier.wait()
    for i in range(n):
        # shared schedules: the two workers race on get-or-create too
        tid = db.start_trial(w, {"i": i % 7}, worker=f"{tag}:{os.getpid()}", optuna_trial=i)
        db.finish_trial(tid, "ok", median_ms=float(i + 1))
    db.close()


def _check_two_writers(url: str, n: int) -> None:
    db = TrialDatabase(url)
    (w,) = db.workloads()
    assert w.num_trials == 2 * n and w.num_ok == 2 * n
    assert db.count_trials(status="running") == 0
    for tag in ("a", "b"):
        rows = [r for r in db.history(w) if r.worker and r.worker.startswith(tag + ":")]
        assert sorted(r.optuna_trial or 0 for r in rows) == list(range(n)) and all(r.optuna_trial is not None for r in rows)
    with db.session() as s:
        if db.dialect == "sqlite":
            assert s.execute(sa.text("PRAGMA integrity_check")).scalar() == "ok"
        assert s.scalar(sa.text("SELECT count(*) FROM rg_schedules")) == 7
        assert s.scalar(sa.text("SELECT count(*) FROM rg_devices")) == 1
        assert s.scalar(sa.text("SELECT count(*) FROM rg_graphs")) == 1


@pytest.mark.slow
def test_sqlite_two_processes_write_concurrently(tmp_path: Path) -> None:
    url = _file_url(tmp_path / "results.db")  # not created yet: both processes race to create it
    n = 40
    barrier = mp.get_context("spawn").Barrier(2)
    _run_workers(_trial_writer, [(url, "a", n, barrier), (url, "b", n, barrier)])
    _check_two_writers(url, n)


def _optuna_opener(url: str, barrier: Any) -> None:
    # Every worker opens the empty database and Optuna's storage at the same moment, as
    # `tune` workers started together do; Optuna's own table creation is not concurrency-safe.
    import optuna

    barrier.wait()
    db = TrialDatabase(url)
    storage = db.optuna_storage()
    study = optuna.create_study(study_name="rgtune:race", storage=storage, load_if_exists=True)
    study.optimize(lambda tr: float(tr.suggest_int("x", 0, 3)), n_trials=2)
    storage.engine.dispose()
    db.close()


def _check_optuna_race(url: str, workers: int) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    barrier = mp.get_context("spawn").Barrier(workers)
    _run_workers(_optuna_opener, [(url, barrier)] * workers)
    study = optuna.load_study(study_name="rgtune:race", storage=url)
    assert len(study.trials) == 2 * workers


@pytest.mark.slow
def test_sqlite_workers_open_optuna_storage_at_once(tmp_path: Path) -> None:
    _check_optuna_race(_file_url(tmp_path / "results.db"), 8)


def test_optuna_storage_on_sqlite_holds_the_write_lock_from_each_transaction_start(tmp_path: Path) -> None:
    # Optuna claims a waiting trial by reading its state and then setting it running: unless the
    # read holds the write lock, two workers claim the same trial (seen in CI: one trial run twice)
    import sqlite3

    path = tmp_path / "results.db"
    storage = TrialDatabase(_file_url(path)).optuna_storage()
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    other.execute("CREATE TABLE probe (x INTEGER)")
    with storage.engine.connect() as conn, conn.begin():
        conn.exec_driver_sql("SELECT count(*) FROM trials").all()  # a read only
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("INSERT INTO probe VALUES (1)")
    other.execute("INSERT INTO probe VALUES (1)")  # released at the end
    other.close()
    storage.engine.dispose()


# ---------------------------------------------------------------------- PostgreSQL
@pytest.mark.slow
def test_postgres_workers_open_optuna_storage_at_once(postgres_url: str) -> None:
    _check_optuna_race(postgres_url, 8)


@pytest.mark.slow
def test_postgres_schema_upgrade_and_best(postgres_url: str) -> None:
    _make_0001_database(postgres_url)
    _check_upgraded_0001_data(TrialDatabase(postgres_url))
    # a fresh open sees head and changes nothing
    assert TrialDatabase(postgres_url).schema_version == SCHEMA_VERSION
    db = TrialDatabase(postgres_url)
    w = _workload(db)
    _trial(db, w, {"a": 1}, "wrong_result", 0.1)
    ok = _trial(db, w, {"a": 2}, "ok", 0.9)
    _trial(db, w, {"a": 3}, "ok", 1.9)
    assert _best_id(db, w) == ok and db.count_trials(w) == 3
    _check_confirmation_decides_the_best(db)


@pytest.mark.slow
def test_postgres_fresh_schema_matches_models_and_refuses_newer(postgres_url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    db = TrialDatabase(postgres_url)
    with db.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts=_COMPARE_OPTS)
        assert compare_metadata(ctx, Base.metadata) == []
    db.close()
    newer = f"{int(SCHEMA_VERSION) + 1:04d}"
    with _raw(postgres_url).begin() as conn:
        conn.exec_driver_sql(f"UPDATE {VERSION_TABLE} SET version_num = '{newer}'")
    with pytest.raises(SchemaVersionError, match=newer):
        TrialDatabase(postgres_url)


@pytest.mark.slow
def test_postgres_two_processes_write_concurrently(postgres_url: str) -> None:
    n = 40
    barrier = mp.get_context("spawn").Barrier(2)
    _run_workers(_trial_writer, [(postgres_url, "a", n, barrier), (postgres_url, "b", n, barrier)])
    _check_two_writers(postgres_url, n)


@pytest.mark.slow
def test_postgres_optuna_and_live_remote_worker(postgres_url: str) -> None:
    db = TrialDatabase(postgres_url)
    w = _workload(db)
    assert _optuna_round(postgres_url, 3) == 3
    now = datetime.now(UTC).replace(tzinfo=None)
    live_remote = _running_trial(db, w, "other-machine:77", now - timedelta(hours=1), now)
    dead_remote = _running_trial(db, w, "other-machine:78", now - timedelta(hours=1), now - timedelta(hours=1))
    assert db.mark_stale_running(w, stale_after=600) == [dead_remote]
    assert db.trial(live_remote).status == "running"
    assert TrialDatabase(postgres_url).count_trials() == 2


@pytest.mark.slow
def test_postgres_errors(postgres_server: _postgres.PostgresServer, postgres_url: str) -> None:
    with pytest.raises(DatabaseUnreachableError, match="does not exist"):
        TrialDatabase(postgres_server.url("no_such_database"))
    db = TrialDatabase(postgres_url)
    with db.session(write=True) as s:
        s.execute(sa.text("DROP TABLE rg_trials"))
    with pytest.raises(DatabaseError) as info:
        db.count_trials()
    assert not isinstance(info.value, DatabaseUnreachableError) and "rg_trials" in _one_line(info.value)
