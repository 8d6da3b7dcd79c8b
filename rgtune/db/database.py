"""The versioned SQL history of every tuning trial: schema, get-or-create, trial lifecycle, queries.

One :class:`TrialDatabase` wraps one database given by a SQLAlchemy URL. The default,
``sqlite:///results.db``, is a file in the working directory; ``postgresql+psycopg://...`` lets
many ``tune`` workers on many machines share one history (and one Optuna study: Optuna's own
RDBStorage tables live in the same database next to rgtune's ``rg_*`` tables).

Opening creates the schema, or upgrades an older one in place (Alembic migrations shipped in
``rgtune/db/migrations``), and refuses a newer one. Every user-caused failure is a
:class:`DatabaseError` with a one-line message; the database is never left half-written.

Example:
    >>> import torch
    >>> from rgtune.data.graph import HeteroGraph
    >>> g = HeteroGraph({"a": 2}, {("a", "r", "a"): (torch.tensor([0, 1]), torch.tensor([1, 0]))}, name="toy")
    >>> db = TrialDatabase("sqlite://")            # in memory; the default is sqlite:///results.db
    >>> cpu = DeviceInfo(name="test cpu", backend="cpu", compiler="gcc 12")
    >>> w = db.ensure_workload("rgcn", g, cpu, in_dim=64, out_dim=64)
    >>> t = db.start_trial(w, {"layout": "csr", "threads": 128})   # committed as "running"
    >>> db.finish_trial(t, "ok", median_ms=1.25, times_ms=[1.2, 1.25, 1.3], max_error=1e-6)
    >>> t2 = db.start_trial(w, {"layout": "coo", "threads": 64})
    >>> db.finish_trial(t2, "wrong_result", median_ms=0.5, max_error=3.0, error="max error 3.0 > 1e-4")
    >>> best = db.best(model="rgcn", dataset="toy")   # only "ok" trials can be best
    >>> best.knobs, best.median_ms
    ({'layout': 'csr', 'threads': 128}, 1.25)
    >>> db.count_trials(w), db.count_trials(w, status="ok"), [r.status for r in db.history(w)]
    (2, 1, ['ok', 'wrong_result'])
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Literal, ParamSpec, Protocol, Self, TypedDict, TypeVar, Unpack

import sqlalchemy as sa
import sqlalchemy.exc as sa_exc
from alembic.util import CommandError
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

import rgtune
from rgtune.db import DEFAULT_URL
from rgtune.db.engine import (
    WRITE_OPTION,
    display_name,
    make_engine,
    parse_url,
    preflight_sqlite,
    serialize_sqlite_transactions,
    sqlite_file,
)
from rgtune.db.errors import (
    DatabaseCorruptError,
    DatabaseError,
    DatabaseLockedError,
    DatabaseReadOnlyError,
    DatabaseUnreachableError,
    DatabaseURLError,
    SchemaVersionError,
    is_retryable,
    one_line,
    translate,
)
from rgtune.db.migrate import check_readable, ensure_schema, schema_lock
from rgtune.db.best import best_trial_id, confirmation_medians, confirmed_winner, rejected_schedules
from rgtune.db.schema import SCHEMA_VERSION, Confirmation, Device, Graph, Schedule, Trial, Verification, Workload
from rgtune.db.queries import (
    StatusArg,
    WorkloadRef,
    checked_name,
    model_key,
    clip_error,
    filtered,
    final_status,
    positive_int,
    rowcount,
    trial_record,
    trial_select,
    with_status,
    workload_id_of,
)
from rgtune.db.optuna_storage import correct_finished_trials, open_storage
from rgtune.db.records import (
    ConfirmationRecord,
    DeviceInfo,
    TrialRecord,
    VerificationRecord,
    WorkloadRecord,
    canonical_json,
    canonical_knobs,
    finite_or_none,
    records_to_json,
    sha256_hex,
    write_csv,
)
from rgtune.db.liveness import abandoned_reason, split_worker, worker_id
from rgtune.db.trial_result import TrialDetails, TrialResult, TrialStatus

__all__ = [
    "SCHEMA_VERSION",
    "TrialDatabase",
    "DeviceInfo",
    "TrialRecord",
    "WorkloadRecord",
    "ConfirmationRecord",
    "VerificationRecord",
    "WorkloadFilter",
    "GraphLike",
    "DatabaseError",
    "DatabaseURLError",
    "DatabaseUnreachableError",
    "DatabaseReadOnlyError",
    "DatabaseCorruptError",
    "DatabaseLockedError",
    "SchemaVersionError",
    "NotFoundError",
    "worker_id",
    "records_to_json",
    "write_csv",
]

P = ParamSpec("P")
T = TypeVar("T")

#: seconds without a sign of life after which a remote worker's running trial is abandoned
DEFAULT_STALE_AFTER = 900.0


class NotFoundError(DatabaseError, LookupError):
    """A trial, workload, device or graph id that is not in the database."""


class _StatsLike(Protocol):
    def as_dict(self) -> Mapping[str, Any]: ...


class GraphLike(Protocol):
    """What the database reads of a graph (:class:`rgtune.data.graph.HeteroGraph` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def content_hash(self) -> str: ...

    @property
    def stats(self) -> _StatsLike: ...


class WorkloadFilter(TypedDict, total=False):
    """Keyword filters of :meth:`TrialDatabase.best`, ``history``, ``count_trials``, ``workloads``."""

    model: str
    dataset: str  # the graph's name
    graph_hash: str
    device: str  # the device's name
    backend: str
    mode: str
    options: str  # the model's options, canonical text ("" for none)
    batches: str  # the sampler the trials were timed on, canonical text ("": the whole graph)
    in_dim: int
    out_dim: int
    heads: int
    study_name: str




def _lost_create_race(exc: sa_exc.DBAPIError) -> bool:
    """A concurrent first open lost the race to create or stamp Optuna's tables (the winner made them)."""
    return any(m in str(exc) for m in ("already exists", "UNIQUE constraint failed", "duplicate key"))


def _utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def _translated(method: Callable[P, T]) -> Callable[P, T]:
    """Driver and Alembic errors leave a public method as one-line :class:`DatabaseError` s."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        self = args[0]
        try:
            return method(*args, **kwargs)
        except (sa_exc.SQLAlchemyError, CommandError) as e:
            raise self._translate(e) from e  # type: ignore[attr-defined]

    return wrapper


def _ok_median(median_ms: float | None) -> float:
    """An ``ok`` trial's median: finite and >= 0 (what makes it eligible for :meth:`TrialDatabase.best`), else
    a ValueError naming it."""
    median = finite_or_none(median_ms, "median_ms")
    if median is None or median < 0:
        raise ValueError(f"an 'ok' trial needs a finite median_ms >= 0, got {median_ms!r}")
    return median


class TrialDatabase:
    """The trial history in one SQL database (any SQLAlchemy URL; see the module docstring).

    Args:
        url: a SQLAlchemy URL, or a path ending in ``.db``/``.sqlite``/``.sqlite3``.
        readonly: only query; nothing is created or upgraded, and the schema must be current.
            SQLite files are opened with SQLite's read-only mode.
        upgrade: upgrade an older schema in place (the default); if False, refuse it.
        busy_timeout: seconds an SQLite writer waits for another process's write lock.
        retries: how often a transaction that hit a lock (or a PostgreSQL serialization
            failure) is re-run before :class:`DatabaseLockedError`.
        echo: log every SQL statement (debugging).

    ``sqlite://`` (in memory) is private to one thread and gone when closed: examples and tests.
    An SQLite file serves the processes of one machine (WAL mode needs shared memory, so not on
    a network filesystem); many machines share a PostgreSQL database.

    Example:
        >>> with TrialDatabase("sqlite://") as db:
        ...     db.schema_version, db.count_trials()
        ('0008', 0)
        >>> TrialDatabase("postgres://")
        Traceback (most recent call last):
        ...
        rgtune.db.errors.DatabaseURLError: unknown database kind 'postgres' in 'postgres://'; use e.g. sqlite:///results.db, a path ending in .db, or postgresql+psycopg://user@host:5432/rgtune
    """

    def __init__(
        self,
        url: str | URL = DEFAULT_URL,
        *,
        readonly: bool = False,
        upgrade: bool = True,
        busy_timeout: float = 30.0,
        retries: int = 5,
        echo: bool = False,
    ) -> None:
        self._url = parse_url(url)
        #: how messages name the database: the SQLite file as given, or the URL without password
        self.name = display_name(self._url)
        self.readonly = readonly
        self._sqlite = self._url.get_backend_name() == "sqlite"
        self._busy_timeout = busy_timeout
        self._retries = max(0, retries)
        path = sqlite_file(self._url)
        if path is not None:
            preflight_sqlite(path, self.name, readonly=readonly)
        try:
            self.engine = make_engine(self._url, readonly=readonly, busy_timeout=busy_timeout, echo=echo)
        except sa_exc.SQLAlchemyError as e:
            raise DatabaseURLError(f"{self.name}: {one_line(e)}") from e
        # Same pool and events; marks transactions as writes (SQLite: BEGIN IMMEDIATE).
        self._writer = self.engine.execution_options(**{WRITE_OPTION: True})
        try:
            if readonly:
                self.schema_version = self._retrying(lambda: self._check_readable())
            else:
                self.schema_version = self._retrying(lambda: ensure_schema(self.engine, self._writer, self.name, upgrade=upgrade))
        except BaseException as e:
            self.engine.dispose()
            if isinstance(e, (sa_exc.SQLAlchemyError, CommandError)):
                raise self._translate(e) from e
            raise

    def _check_readable(self) -> str:
        with self.engine.connect() as conn:
            return check_readable(conn, self.name)

    # ------------------------------------------------------------------ plumbing
    @property
    def url(self) -> str:
        """A URL that connects to this very database, e.g. for ``optuna.storages.RDBStorage``.

        SQLite paths are absolute (a later chdir cannot change which file it names), and a
        password is included: print :attr:`name` (password hidden) instead.
        """
        return self.engine.url.render_as_string(hide_password=False)

    @_translated
    def optuna_storage(self) -> Any:
        """An ``optuna.storages.RDBStorage`` on this database (:mod:`.optuna_storage`), safe to open from many
        workers at once.

        RDBStorage creates and stamps its tables on first use without any locking; concurrent
        first opens are serialized here (PostgreSQL: an advisory lock) or, on SQLite, the losers
        of the race (a duplicate ``alembic_version`` row, a table that already exists) retry and
        find the winner's tables. On SQLite every transaction of the storage then takes the write lock
        when it begins, so that two workers never claim the same waiting trial
        (:func:`~rgtune.db.engine.serialize_sqlite_transactions`).
        """
        if self.readonly:
            raise DatabaseReadOnlyError(f"{self.name} was opened read-only; Optuna's storage writes to it")
        # the same SQLite file is written by rgtune's own engine: wait for its locks instead of failing
        kwargs: dict[str, Any] = {"connect_args": {"timeout": 60}} if self.dialect == "sqlite" else {}

        def locked_open() -> Any:
            with schema_lock(self._writer):
                storage = open_storage(self.url, kwargs)
            if self.dialect == "sqlite":
                serialize_sqlite_transactions(storage.engine, busy_timeout=60)
            return storage

        return self._retrying(locked_open, also=_lost_create_race)

    @property
    def dialect(self) -> str:
        """``"sqlite"``, ``"postgresql"``, ..."""
        return self._url.get_backend_name()

    def close(self) -> None:
        """Close pooled connections (the object can still be used; it reconnects)."""
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TrialDatabase({self.name!r}, schema {self.schema_version}{', read-only' if self.readonly else ''})"

    def explain(self, e: BaseException) -> DatabaseError:
        """The one-line :class:`DatabaseError` for a failure of this database: a driver or SQLAlchemy error,
        also one that reached the caller through another library using the same database (Optuna's
        storage wraps them: the cause is explained)."""
        if not isinstance(e, sa_exc.SQLAlchemyError) and isinstance(e.__cause__, sa_exc.SQLAlchemyError):
            e = e.__cause__
        return self._translate(e)

    def _translate(self, e: BaseException) -> DatabaseError:
        if isinstance(e, CommandError):
            return DatabaseError(f"{self.name}: schema migration failed: {one_line(e)}")
        return translate(e, self.name, sqlite=self._sqlite, busy_timeout=self._busy_timeout)

    @contextmanager
    def session(self, *, write: bool = False) -> Iterator[Session]:
        """A SQLAlchemy session for queries this class does not offer; commits on success.

        Example:
            >>> from rgtune.db.schema import Trial
            >>> db = TrialDatabase("sqlite://")
            >>> with db.session() as s:
            ...     s.scalar(sa.select(sa.func.count()).select_from(Trial))
            0
        """
        if write and self.readonly:
            raise DatabaseReadOnlyError(f"{self.name} was opened read-only")
        with Session(self._writer if write else self.engine, expire_on_commit=False) as s, s.begin():
            yield s

    def _retrying(self, fn: Callable[[], T], also: Callable[[sa_exc.DBAPIError], bool] | None = None) -> T:
        """Run ``fn``, re-running it after retryable errors (and those ``also`` accepts)."""
        delay = 0.05
        for attempt in range(self._retries + 1):
            try:
                return fn()
            except sa_exc.DBAPIError as e:
                if attempt == self._retries or not (is_retryable(e) or (also is not None and also(e))):
                    raise
            time.sleep(delay * (1.0 + random.random()))  # jitter: two losers must not collide again
            delay = min(delay * 2, 2.0)
        raise AssertionError("unreachable")

    def _write(self, fn: Callable[[Session], T]) -> T:
        """Run ``fn`` in one short write transaction, re-run on lock errors; commits."""
        if self.readonly:
            raise DatabaseReadOnlyError(f"{self.name} was opened read-only; open it without readonly=True to record trials")

        def once() -> T:
            with Session(self._writer, expire_on_commit=False) as s, s.begin():
                return fn(s)

        return self._retrying(once)

    def _read(self, fn: Callable[[Session], T]) -> T:
        def once() -> T:
            with Session(self.engine, expire_on_commit=False) as s, s.begin():
                return fn(s)

        return self._retrying(once)

    def _get_or_create(self, model: type[Any], key: Mapping[str, Any], values: Callable[[], Mapping[str, Any]]) -> int:
        """The id of the row of ``model`` with ``key``, inserting ``key | values()`` if missing.

        Two processes may insert the same key at once (PostgreSQL; SQLite's writers are
        serialized): the loser's unique violation means the row now exists, so look again.
        """

        def find(s: Session) -> int | None:
            found = s.scalar(sa.select(model.id).filter_by(**key))
            return None if found is None else int(found)

        def create(s: Session) -> int:
            found = find(s)  # again: another writer may have created it since the read
            if found is not None:
                return found
            row = model(**key, **values())
            s.add(row)
            s.flush()
            return int(row.id)

        # A read first: rows exist almost always, and reads take no write lock.
        found = self._read(find)
        if found is not None:
            return found
        try:
            return self._write(create)
        except sa_exc.IntegrityError:
            found = self._read(find)
            if found is None:
                raise
            return found

    # ------------------------------------------------------------------ get-or-create
    @_translated
    def ensure_device(self, device: DeviceInfo | Mapping[str, Any]) -> int:
        """The id of ``device`` (a :class:`DeviceInfo` or a backend's ``device_info()`` dict).

        Example:
            >>> db = TrialDatabase("sqlite://")
            >>> a = db.ensure_device({"backend": "cpu", "device": "x86_64", "compiler": "gcc 12"})
            >>> b = db.ensure_device(DeviceInfo(name="x86_64", backend="cpu", compiler="gcc 12"))
            >>> a == b
            True
        """
        info = device if isinstance(device, DeviceInfo) else DeviceInfo.from_mapping(device)
        extra = dict(canonical_knobs(dict(info.extra))[0])
        return self._get_or_create(
            Device,
            {"fingerprint": info.fingerprint},
            lambda: {
                "name": info.name,
                "architecture": info.architecture,
                "runtime": info.runtime,
                "compiler": info.compiler,
                "backend": info.backend,
                "extra": extra,
                "created_at": _utcnow(),
            },
        )

    @_translated
    def ensure_graph(self, graph: GraphLike) -> int:
        """The id of ``graph``, keyed by its content hash (name and statistics stored once)."""
        # NaN/inf are not JSON; a statistic that is undefined for this graph is stored as null.
        raw = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in graph.stats.as_dict().items()}
        stats = canonical_knobs(raw)[0]

        def values() -> dict[str, Any]:
            return {
                "name": str(graph.name),
                "stats": stats,
                "num_nodes": int(stats.get("num_nodes", 0)),
                "num_edges": int(stats.get("num_edges", 0)),
                "num_rels": int(stats.get("num_rels", 0)),
                "created_at": _utcnow(),
            }

        return self._get_or_create(Graph, {"content_hash": str(graph.content_hash)}, values)

    @_translated
    def ensure_schedule(self, knobs: Mapping[str, Any]) -> int:
        """The id of the schedule with these knob values (canonical JSON, so key order is irrelevant)."""
        canon, digest = canonical_knobs(knobs)
        return self._get_or_create(Schedule, {"hash": digest}, lambda: {"knobs": canon, "created_at": _utcnow()})

    @_translated
    def ensure_workload(
        self,
        model: str,
        graph: GraphLike | int,
        device: DeviceInfo | Mapping[str, Any] | int,
        *,
        in_dim: int,
        out_dim: int,
        heads: int = 1,
        backend: str | None = None,
        mode: str = "inference",
        options: str = "",
        batches: str = "",
        precision: str = "fp32",
    ) -> WorkloadRecord:
        """The workload (one model with its options at given sizes on one graph, device, backend, mode,
        timed on the whole graph or on one sampler's batches); get or create.

        ``backend`` defaults to the device's; ``options`` is the model's options as canonical text
        (``ModelSpec.key``; ``""``: none); ``batches`` is the sampler's canonical text
        (``"neighbor:fanout=15x10,batch_size=1024"``; ``""``: the whole graph), since the best
        schedule for sampled subgraphs need not be the whole graph's; ``precision`` the storage types its
        schedules may use (``fp32``, ``bf16``, ``fp16``, ``any``: ``tune --precision``). The record's
        ``study_name`` names its Optuna study.
        """
        model = model_key(checked_name(model, "model", limit=255))
        mode = checked_name(mode, "mode")
        dims = {k: positive_int(v, k) for k, v in (("in_dim", in_dim), ("out_dim", out_dim), ("heads", heads))}
        graph_id = graph if isinstance(graph, int) else self.ensure_graph(graph)
        device_id = device if isinstance(device, int) else self.ensure_device(device)

        def lookup(s: Session) -> tuple[Graph, Device]:
            g, d = s.get(Graph, graph_id), s.get(Device, device_id)
            if g is None:
                raise NotFoundError(f"{self.name} has no graph with id {graph_id}")
            if d is None:
                raise NotFoundError(f"{self.name} has no device with id {device_id}")
            return g, d

        g, d = self._read(lookup)
        backend = checked_name(backend or d.backend, "backend")
        if not isinstance(options, str) or len(options) > 255:
            raise ValueError(f"options must be the canonical text of a model's options (at most 255 characters), "
                             f"got {options!r}")
        if not isinstance(batches, str) or len(batches) > 255:
            raise ValueError(f"batches must be the canonical text of a sampler (at most 255 characters), got {batches!r}")
        from rgtune.ir.passes.precision import check_policy  # here: the database's other users need no torch

        check_policy(precision)
        key = {"model": model, **dims, "graph_id": graph_id, "device_id": device_id, "backend": backend, "mode": mode,
               "options": options, "batches": batches, "precision": precision}
        # no options or batches, float32: the name it had before they existed (Optuna studies are found by name)
        named = {k: v for k, v in key.items()
                 if k not in ("options", "batches", "precision") or (v and v != "fp32")}
        digest = sha256_hex(canonical_json({**named, "graph_id": g.content_hash, "device_id": d.fingerprint}))
        study = f"rgtune:{model[-64:]}:{g.name[:64]}:{backend}:{mode}:{digest[:12]}"  # fits study_name's 255
        wid = self._get_or_create(Workload, key, lambda: {"study_name": study, "created_at": _utcnow()})
        return self.workloads(workload_id=wid)[0]

    # ------------------------------------------------------------------ trial lifecycle
    @_translated
    def start_trial(
        self,
        workload: WorkloadRef,
        knobs: Mapping[str, Any] | int,
        *,
        optuna_trial: int | None = None,
        predicted_ms: float | None = None,
        source_hash: str | None = None,
        worker: str | None = None,
        rgtune_version: str | None = None,
        confirmation_id: int | None = None,
    ) -> int:
        """Record a trial as ``running`` and commit at once (a crash leaves the record); its id.

        ``knobs`` are the schedule's knob values, or a schedule id. ``worker`` defaults to this
        process's ``host:pid`` (see :meth:`mark_stale_running`). ``confirmation_id``: the trial is
        a round of that confirmation (:meth:`start_confirmation`), not a trial of the search.
        """
        wid = workload_id_of(workload)
        sid = knobs if isinstance(knobs, int) else self.ensure_schedule(knobs)
        predicted = finite_or_none(predicted_ms, "predicted_ms")
        now = _utcnow()

        def fn(s: Session) -> int:
            if s.get(Workload, wid) is None:
                raise NotFoundError(f"{self.name} has no workload with id {wid}")
            if s.get(Schedule, sid) is None:
                raise NotFoundError(f"{self.name} has no schedule with id {sid}")
            if confirmation_id is not None and s.get(Confirmation, confirmation_id) is None:
                raise NotFoundError(f"{self.name} has no confirmation with id {confirmation_id}")
            t = Trial(
                workload_id=wid,
                schedule_id=sid,
                optuna_trial=optuna_trial,
                status=TrialStatus.RUNNING.value,
                predicted_ms=predicted,
                source_hash=source_hash,
                worker=worker or worker_id(),
                rgtune_version=rgtune_version or rgtune.__version__,
                started_at=now,
                heartbeat_at=now,
                confirmation_id=confirmation_id,
            )
            s.add(t)
            s.flush()
            return int(t.id)

        return self._write(fn)

    @_translated
    def heartbeat(self, trial_id: int) -> bool:
        """Note that a running trial's worker is alive; False if the trial is no longer ``running``
        (e.g. another worker declared it abandoned)."""
        now = _utcnow()
        return self._write(
            lambda s: rowcount(
                s.execute(sa.update(Trial).where(Trial.id == trial_id, Trial.status == TrialStatus.RUNNING.value).values(heartbeat_at=now))
            )
            == 1
        )

    @_translated
    def heartbeat_worker(self, worker: str | None = None) -> int:
        """Note that every ``running`` trial of ``worker`` (default: this process, ``host:pid``) is alive;
        how many there are. A tuner calls it while it waits for a long measurement."""
        me = worker or worker_id()
        now = _utcnow()
        return self._write(lambda s: rowcount(s.execute(
            sa.update(Trial).where(Trial.worker == me, Trial.status == TrialStatus.RUNNING.value).values(heartbeat_at=now))))

    @_translated
    def finish_trial(
        self,
        trial_id: int,
        status: TrialStatus | str,
        *,
        median_ms: float | None = None,
        times_ms: Iterable[float] | None = None,
        compile_s: float | None = None,
        max_error: float | None = None,
        error: str | None = None,
        source_hash: str | None = None,
        predicted_ms: float | None = None,
        peak_bytes: int | None = None,
        details: TrialDetails | None = None,
    ) -> None:
        """Record a trial's outcome (any status but ``running``).

        ``ok`` needs a finite ``median_ms``: it is what makes a trial eligible for :meth:`best`.
        A non-finite ``max_error`` of a failed trial (a kernel that produced NaN) is stored as NULL.
        Finishing a trial that :meth:`mark_stale_running` declared abandoned overwrites that
        verdict: the worker was alive after all, and its measurement is real.
        """
        st = final_status(status)
        median = _ok_median(median_ms) if st is TrialStatus.OK else finite_or_none(median_ms, "median_ms")
        times = None if times_ms is None else [finite_or_none(float(x), "times_ms entry") for x in times_ms]
        if max_error is not None and st is not TrialStatus.OK and not math.isfinite(float(max_error)):
            max_error = None  # a kernel that produced NaN/inf; the status and error say what happened
        values: dict[str, Any] = {
            "status": st.value,
            "median_ms": median,
            "times_ms": times,
            "compile_s": finite_or_none(compile_s, "compile_s"),
            "max_error": finite_or_none(max_error, "max_error"),
            "error": clip_error(error),
            "finished_at": _utcnow(),
        }
        if source_hash is not None:
            values["source_hash"] = source_hash
        if predicted_ms is not None:
            values["predicted_ms"] = finite_or_none(predicted_ms, "predicted_ms")
        if peak_bytes is not None:
            values["peak_bytes"] = int(peak_bytes)
        if details is not None and (stored := details.to_json()):
            values["details"] = json.loads(canonical_json(stored))

        def fn(s: Session) -> None:
            if rowcount(s.execute(sa.update(Trial).where(Trial.id == trial_id).values(**values))) != 1:
                raise NotFoundError(f"{self.name} has no trial with id {trial_id}")

        self._write(fn)

    def record_result(self, trial_id: int, result: TrialResult) -> None:
        """Finish a started trial with a measurement's outcome: its seconds as the columns' ms, its peak memory
        (or, refused before running, its estimate), the cost model's prediction, and its details.

        Example:
            >>> from rgtune.data.synthetic import random_graph
            >>> from rgtune.db.trial_result import TrialResult
            >>> db = TrialDatabase("sqlite://")
            >>> g = random_graph((10, 20), num_relations=2, num_edges=60, seed=0)
            >>> w = db.ensure_workload("rgcn", g, DeviceInfo(name="cpu0", backend="cpu"), in_dim=8, out_dim=8)
            >>> t = db.start_trial(w, {"layout": "csr"})
            >>> db.record_result(t, TrialResult("ok", median=0.002, times=[0.002, 0.003]))
            >>> db.trial(t).median_ms, db.trial(t).times_ms
            (2.0, [2.0, 3.0])
        """
        d = result.details
        self.finish_trial(
            trial_id, result.status, median_ms=None if result.median is None else result.median * 1e3,
            times_ms=[t * 1e3 for t in result.times] or None, compile_s=result.compile_seconds,
            max_error=result.max_error, error=result.error, source_hash=result.source_hash,
            predicted_ms=d.predicted_ms, peak_bytes=d.memory.recorded_bytes, details=d)

    @_translated
    def import_measured(self, workload: WorkloadRef, rows: Iterable[tuple[Mapping[str, Any], float]]) -> int:
        """Record finished ``ok`` trials of ``workload`` from ``(knobs, median_ms)`` rows, all in one transaction
        (a history loaded from elsewhere, e.g. :func:`rgtune.costmodel.frozen.thaw`: thousands of trials, where
        :meth:`start_trial` and :meth:`record_result` commit twice each); how many.

        Example:
            >>> from rgtune.data.synthetic import random_graph
            >>> db = TrialDatabase("sqlite://")
            >>> g = random_graph((10, 20), num_relations=2, num_edges=60, seed=0)
            >>> w = db.ensure_workload("rgcn", g, DeviceInfo(name="cpu0", backend="cpu"), in_dim=8, out_dim=8)
            >>> db.import_measured(w, [({"layout": "csr"}, 2.0), ({"layout": "coo"}, 3.0), ({"layout": "csr"}, 2.5)])
            3
            >>> sorted(t.median_ms for t in db.history(w))
            [2.0, 2.5, 3.0]
        """
        wid = workload_id_of(workload)
        measured = [(*canonical_knobs(knobs), _ok_median(ms)) for knobs, ms in rows]
        now, me = _utcnow(), worker_id()

        def fn(s: Session) -> int:
            if s.get(Workload, wid) is None:
                raise NotFoundError(f"{self.name} has no workload with id {wid}")
            ids = {h: int(i) for h, i in s.execute(sa.select(Schedule.hash, Schedule.id).where(
                Schedule.hash.in_({digest for _, digest, _ in measured})))}
            for canon, digest, _ in measured:
                if digest not in ids:
                    row = Schedule(hash=digest, knobs=canon, created_at=now)
                    s.add(row)
                    s.flush()
                    ids[digest] = int(row.id)
            s.add_all(Trial(workload_id=wid, schedule_id=ids[digest], status=TrialStatus.OK.value, median_ms=median,
                            worker=me, rgtune_version=rgtune.__version__, started_at=now, heartbeat_at=now,
                            finished_at=now) for _, digest, median in measured)
            return len(measured)

        return self._write(fn)

    @_translated
    def mark_stale_running(
        self,
        workload: WorkloadRef | None = None,
        *,
        worker: str | None = None,
        stale_after: float = DEFAULT_STALE_AFTER,
    ) -> list[int]:
        """Turn the ``running`` trials of dead workers into ``failed``; their ids.

        Call it when a study resumes (after Ctrl-C or kill -9). ``worker`` is the *caller's* id
        (default: this process's ``host:pid``); its host part says which trials are local.
        The rule (:mod:`rgtune.db.liveness`): a local worker is dead when its process is
        gone (or its pid was reused); a remote or unknown one when it gave no sign of life
        (:meth:`heartbeat`, else the start) for ``stale_after`` seconds. A live worker's trial,
        local or on another machine sharing a PostgreSQL database, is never touched.
        ``workload=None`` scans every workload.
        """
        me = worker or worker_id()
        host = split_worker(me)[0] or ""
        wid = None if workload is None else workload_id_of(workload)

        def fn(s: Session) -> list[int]:
            now = _utcnow()
            q = sa.select(Trial.id, Trial.worker, Trial.started_at, Trial.heartbeat_at).where(Trial.status == TrialStatus.RUNNING.value)
            if wid is not None:
                q = q.where(Trial.workload_id == wid)
            marked = []
            for tid, w, started, beat in s.execute(q).all():
                reason = abandoned_reason(w, started, beat, host=host, now=now, stale_after=stale_after)
                if reason is None:
                    continue
                # Guarded by status: a worker that finished meanwhile keeps its result.
                res = s.execute(
                    sa.update(Trial)
                    .where(Trial.id == tid, Trial.status == TrialStatus.RUNNING.value)
                    .values(status=TrialStatus.FAILED.value, error=f"{reason} (found by {me})", finished_at=now)
                )
                if rowcount(res) == 1:
                    marked.append(int(tid))
            return marked

        return self._write(fn)

    # ------------------------------------------------------------------ queries
    @_translated
    def trial(self, trial_id: int) -> TrialRecord:
        """One trial by id."""
        rows = self._read(lambda s: s.execute(trial_select().where(Trial.id == trial_id)).all())
        if not rows:
            raise NotFoundError(f"{self.name} has no trial with id {trial_id}")
        return trial_record(*rows[0])

    @_translated
    def study_trial_number(self, trial: TrialRecord) -> int | None:
        """The number in its workload's Optuna study of the search trial that first measured ``trial``'s
        schedule: the trial's own number for a search trial, its schedule's for a confirmation round. It is how
        the study and optuna-dashboard name it (a record's ``id`` counts across the whole database). None: no
        search trial of the study measured that schedule."""
        if trial.optuna_trial is not None:
            return trial.optuna_trial
        return self._read(lambda s: s.execute(
            sa.select(Trial.optuna_trial)
            .where(Trial.workload_id == trial.workload_id, Trial.schedule_id == trial.schedule_id,
                   Trial.optuna_trial.is_not(None))
            .order_by(Trial.id).limit(1)).scalar())

    @_translated
    def best(self, workload: WorkloadRef | None = None, **filters: Unpack[WorkloadFilter]) -> TrialRecord | None:
        """The best ``ok`` trial among the matching workloads, or None. Only ``ok`` trials (verified,
        timed) are ever considered.

        Per workload: without a confirmation, its fastest trial (lowest median; the earliest on a
        tie); after one (:meth:`start_confirmation`), the confirmed winner: the schedule with the
        lowest median over the rounds of the latest finished confirmation, as its middle round
        (a faster trial of the search recorded after that confirmation wins instead). Across
        workloads, the lowest median of those.

        Filters select workloads; times only compare on one device and graph, so callers
        normally pin the workload, or model + dataset + device.
        """
        ids_q = sa.select(Workload.id).join(Graph, Workload.graph_id == Graph.id).join(
            Device, Workload.device_id == Device.id)
        ids_q = filtered(ids_q, workload, filters).distinct()

        def fn(s: Session) -> list[Any]:
            # one pinned workload (the tuner, every trial) needs no query to find it
            wids = [workload_id_of(workload)] if workload is not None and not filters else s.scalars(ids_q).all()
            picks = [t for wid in wids if (t := best_trial_id(s, int(wid))) is not None]
            if not picks:
                return []
            q = trial_select().where(Trial.id.in_(picks)).order_by(Trial.median_ms, Trial.id).limit(1)
            return list(s.execute(q).all())

        rows = self._read(fn)
        if not rows:
            return None
        best = trial_record(*rows[0])
        verified = sum(v.inputs for v in self.verifications(best.workload_id, schedule_hash=best.schedule_hash)
                       if v.status == TrialStatus.OK.value)
        return dataclasses.replace(best, verified_inputs=verified)

    @_translated
    def confirmed_best(self, workload: WorkloadRef) -> TrialRecord | None:
        """The winner of the workload's latest finished confirmation (its middle round), or None;
        unlike :meth:`best`, whatever the search measured after it."""
        wid = workload_id_of(workload)
        winner = self._read(lambda s: confirmed_winner(s, wid))
        return None if winner is None else self.trial(winner[0])

    @_translated
    def start_confirmation(self, workload: WorkloadRef, *, schedules: int, rounds: int) -> int:
        """Record that ``schedules`` schedules of ``workload`` are about to be timed again in ``rounds``
        interleaved rounds (each round of each a trial started with this ``confirmation_id``); its id.

        Until :meth:`finish_confirmation`, :meth:`best` ignores it (an interrupted one never counts).
        """
        wid = workload_id_of(workload)
        n, r = positive_int(schedules, "schedules"), positive_int(rounds, "rounds")

        def fn(s: Session) -> int:
            if s.get(Workload, wid) is None:
                raise NotFoundError(f"{self.name} has no workload with id {wid}")
            c = Confirmation(workload_id=wid, schedules=n, rounds=r, worker=worker_id(), started_at=_utcnow())
            s.add(c)
            s.flush()
            return int(c.id)

        return self._write(fn)

    @_translated
    def finish_confirmation(self, confirmation_id: int) -> None:
        """Mark a confirmation complete: from now on :meth:`best` reads its rounds."""
        now = _utcnow()

        def fn(s: Session) -> None:
            q = sa.update(Confirmation).where(Confirmation.id == confirmation_id).values(finished_at=now)
            if rowcount(s.execute(q)) != 1:
                raise NotFoundError(f"{self.name} has no confirmation with id {confirmation_id}")

        self._write(fn)

    @_translated
    def confirmation(self, confirmation_id: int) -> ConfirmationRecord:
        """One confirmation by id."""
        c = self._read(lambda s: s.get(Confirmation, confirmation_id))
        if c is None:
            raise NotFoundError(f"{self.name} has no confirmation with id {confirmation_id}")
        return ConfirmationRecord(c.id, c.workload_id, c.schedules, c.rounds, c.worker, c.started_at, c.finished_at)

    @_translated
    def confirmation_medians(self, confirmation_id: int) -> dict[str, float]:
        """Schedule hash -> the median ms of its ``ok`` rounds in a confirmation (finished or not), leaving
        out schedules that failed a re-verification."""

        def fn(s: Session) -> dict[str, float]:
            c = s.get(Confirmation, confirmation_id)
            if c is None:
                raise NotFoundError(f"{self.name} has no confirmation with id {confirmation_id}")
            medians = confirmation_medians(s, confirmation_id, rejected_schedules(s, c.workload_id))
            hashes = dict(s.execute(sa.select(Schedule.id, Schedule.hash).where(Schedule.id.in_(medians))).all())
            return {hashes[sch]: ms for sch, ms in medians.items()}

        return self._read(fn)

    @_translated
    def correct_optuna_trials(self, study_name: str, values: Mapping[int, float], failed: Iterable[int] = ()) -> None:
        """Give finished trials of the Optuna study ``study_name`` on this database new values, or mark them failed.

        ``values`` and ``failed`` are keyed by the trials' numbers in the study (``FrozenTrial.number``).
        Optuna has no API to correct a finished trial; the end-of-run confirmation does it so that the
        study's best trial is the confirmed one (:mod:`rgtune.tuner.confirmation`), through
        :func:`rgtune.db.optuna_storage.correct_finished_trials` (its docstring says why and how it is guarded).
        """
        self._write(lambda s: correct_finished_trials(s, study_name, values, list(failed)))

    @_translated
    def record_verification(
        self,
        workload: WorkloadRef,
        knobs: Mapping[str, Any],
        status: TrialStatus | str,
        *,
        inputs: int,
        runs: int,
        max_error: float | None = None,
        error: str | None = None,
        source_hash: str | None = None,
        confirmation_id: int | None = None,
    ) -> int:
        """Record that a schedule of ``workload`` was verified again on ``inputs`` fresh inputs, each run
        ``runs`` times: ``ok``, or ``wrong_result`` (then :meth:`best` never returns it); its id."""
        st = final_status(status)
        if st not in (TrialStatus.OK, TrialStatus.WRONG_RESULT):
            raise ValueError(f"a verification is 'ok' or 'wrong_result', got {st.value!r}")
        wid = workload_id_of(workload)
        n, r = positive_int(inputs, "inputs"), positive_int(runs, "runs")
        canon, _ = canonical_knobs(knobs)
        sid = self.ensure_schedule(canon)

        def fn(s: Session) -> int:
            # a wrong kernel's error may be NaN or inf: stored as NULL, the status and message say what happened
            err = None if max_error is None or not math.isfinite(max_error) else float(max_error)
            v = Verification(workload_id=wid, schedule_id=sid, confirmation_id=confirmation_id, status=st.value,
                             inputs=n, runs=r, max_error=err, error=clip_error(error), source_hash=source_hash,
                             worker=worker_id(), created_at=_utcnow())
            s.add(v)
            s.flush()
            return int(v.id)

        return self._write(fn)

    @_translated
    def verifications(self, workload: WorkloadRef, *, schedule_hash: str | None = None) -> list[VerificationRecord]:
        """The re-verifications of a workload's schedules (of one schedule with ``schedule_hash``), oldest first."""
        q = (sa.select(Verification, Schedule.hash).join(Schedule, Verification.schedule_id == Schedule.id)
             .where(Verification.workload_id == workload_id_of(workload)).order_by(Verification.id))
        if schedule_hash is not None:
            q = q.where(Schedule.hash == schedule_hash)
        return [VerificationRecord(v.id, v.workload_id, h, v.confirmation_id, v.status, v.inputs, v.runs, v.max_error,
                                   v.error, v.source_hash, v.worker, v.created_at)
                for v, h in self._read(lambda s: s.execute(q).all())]

    @_translated
    def history(
        self,
        workload: WorkloadRef | None = None,
        *,
        status: StatusArg = None,
        order: Literal["oldest", "newest", "fastest"] = "oldest",
        limit: int | None = None,
        **filters: Unpack[WorkloadFilter],
    ) -> list[TrialRecord]:
        """Trials of the matching workloads: oldest first, newest first, or fastest first
        (trials without a time last)."""
        q = with_status(filtered(trial_select(), workload, filters), status)
        if order == "oldest":
            q = q.order_by(Trial.id)
        elif order == "newest":
            q = q.order_by(Trial.id.desc())
        elif order == "fastest":
            q = q.order_by(Trial.median_ms.is_(None), Trial.median_ms, Trial.id)
        else:
            raise ValueError(f"order must be 'oldest', 'newest' or 'fastest', got {order!r}")
        if limit is not None:
            q = q.limit(positive_int(limit, "limit"))
        return [trial_record(*row) for row in self._read(lambda s: s.execute(q).all())]

    @_translated
    def count_trials(self, workload: WorkloadRef | None = None, *, status: StatusArg = None, **filters: Unpack[WorkloadFilter]) -> int:
        """How many trials match (all statuses unless ``status`` is given)."""
        q = sa.select(sa.func.count(Trial.id)).select_from(Trial).join(Workload).join(Graph).join(Device)
        q = with_status(filtered(q, workload, filters), status)
        return int(self._read(lambda s: s.scalar(q)) or 0)

    @_translated
    def workloads(self, *, workload_id: int | None = None, **filters: Unpack[WorkloadFilter]) -> list[WorkloadRecord]:
        """The workloads matching the filters, with trial counts and best time, oldest first."""
        ok = Trial.status == TrialStatus.OK.value
        q = (
            sa.select(
                Workload,
                Graph,
                Device,
                sa.func.count(Trial.id),
                sa.func.sum(sa.case((ok, 1), else_=0)),
                sa.func.min(sa.case((ok, Trial.median_ms), else_=None)),
            )
            .join(Graph, Workload.graph_id == Graph.id)
            .join(Device, Workload.device_id == Device.id)
            .outerjoin(Trial, Trial.workload_id == Workload.id)
        )
        # Filter first, then aggregate only the matching workloads' trials. Grouping by the three
        # primary keys is enough for PostgreSQL (the other columns depend on them).
        q = filtered(q, workload_id, filters).group_by(Workload.id, Graph.id, Device.id).order_by(Workload.id)
        rows = self._read(lambda s: s.execute(q).all())
        return [
            WorkloadRecord(
                id=w.id,
                model=w.model,
                dataset=g.name,
                graph_hash=g.content_hash,
                device=d.name,
                device_fingerprint=d.fingerprint,
                backend=w.backend,
                mode=w.mode,
                options=w.options,
                batches=w.batches,
                precision=w.precision,
                in_dim=w.in_dim,
                out_dim=w.out_dim,
                heads=w.heads,
                study_name=w.study_name,
                created_at=w.created_at,
                num_trials=int(n or 0),
                num_ok=int(n_ok or 0),
                best_ms=best,
            )
            for w, g, d, n, n_ok, best in rows
        ]
