"""The ORM tables of the trial database, at the current schema revision (``SCHEMA_VERSION``).

Every table is prefixed ``rg_`` and the Alembic version table is ``rg_alembic_version``, so that
Optuna's own RDBStorage tables (``studies``, ``trials``, ``alembic_version``, ...) can live in the
same database. These classes describe the *head* revision; the migrations under
``rgtune/db/migrations/versions`` are written by hand and never import this module (a
migration must keep meaning what it meant when it was written). A test checks that the
migrated schema and these classes agree.

Units are in the column names: times in milliseconds (``*_ms``), compile time in seconds.
Timestamps are naive UTC.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Float, ForeignKey, Index, Integer, MetaData, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

__all__ = ["SCHEMA_VERSION", "VERSION_TABLE", "TABLE_PREFIX", "Base", "Device", "Graph", "Workload", "Schedule",
           "Confirmation", "Verification", "Trial"]

#: the Alembic revision these classes describe; a test checks it is the migrations' head
SCHEMA_VERSION = "0008"
VERSION_TABLE = "rg_alembic_version"
TABLE_PREFIX = "rg_"

# Named constraints: SQLite's batch migrations can only alter/drop constraints that have names.
NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSON, list[float]: JSON}


class Device(Base):
    """A device + software stack: a time is only comparable with times on the same one."""

    __tablename__ = "rg_devices"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 of all fields, canonical JSON
    name: Mapped[str] = mapped_column(String(200))  # "NVIDIA H200", "AMD EPYC 9654"
    architecture: Mapped[str] = mapped_column(String(100), default="")  # "sm_90", "x86_64 avx512"
    runtime: Mapped[str] = mapped_column(String(200), default="")  # driver / CUDA runtime, or OS + libc
    compiler: Mapped[str] = mapped_column(String(200), default="")  # "nvrtc 12.4", "gcc 12.2"
    backend: Mapped[str] = mapped_column(String(32))  # "cuda", "cpu", "reference"
    extra: Mapped[dict[str, Any]] = mapped_column(default=dict)  # everything else the backend reported
    created_at: Mapped[datetime] = mapped_column(DateTime)


class Graph(Base):
    """A graph by structure: the same edges under two dataset names are one row (first name kept)."""

    __tablename__ = "rg_graphs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    content_hash: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    stats: Mapped[dict[str, Any]] = mapped_column(default=dict)  # GraphStats.as_dict()
    num_nodes: Mapped[int] = mapped_column(BigInteger)
    num_edges: Mapped[int] = mapped_column(BigInteger)
    num_rels: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime)


class Workload(Base):
    """What is tuned: one model at given sizes, on one graph (whole or one sampler's batches), device and backend;
    one Optuna study."""

    __tablename__ = "rg_workloads"
    __table_args__ = (
        UniqueConstraint("model", "in_dim", "out_dim", "heads", "graph_id", "device_id", "backend", "mode", "options",
                         "batches", "precision", name="uq_rg_workloads_key"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(255))  # a registered name, or "package.module:builder"
    #: the model's options: the non-default ones, canonical text ("num_bases=30"); "" for none
    options: Mapped[str] = mapped_column(String(255), default="", server_default="")
    in_dim: Mapped[int] = mapped_column(Integer)
    out_dim: Mapped[int] = mapped_column(Integer)
    heads: Mapped[int] = mapped_column(Integer)
    graph_id: Mapped[int] = mapped_column(ForeignKey("rg_graphs.id"), index=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("rg_devices.id"), index=True)
    backend: Mapped[str] = mapped_column(String(32))
    mode: Mapped[str] = mapped_column(String(32))  # "inference", "training"
    study_name: Mapped[str] = mapped_column(String(255), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    # --- added by revision 0007
    #: the sampler the workload's trials were timed on, canonical text ("neighbor:fanout=15x10,batch_size=1024");
    #: "" for the whole graph
    batches: Mapped[str] = mapped_column(String(255), default="", server_default="")
    # --- added by revision 0008
    #: the storage types the trials' schedules may keep intermediates in (``tune --precision``: fp32, bf16,
    #: fp16, any; :data:`rgtune.ir.passes.precision.POLICIES`); "fp32" for rows from before
    precision: Mapped[str] = mapped_column(String(16), default="fp32", server_default="fp32")

    graph: Mapped[Graph] = relationship(lazy="joined")
    device: Mapped[Device] = relationship(lazy="joined")


class Schedule(Base):
    """One point of a search space: knob values as canonical JSON (sorted keys), keyed by its sha256."""

    __tablename__ = "rg_schedules"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    hash: Mapped[str] = mapped_column(String(64), unique=True)
    knobs: Mapped[dict[str, Any]] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(DateTime)


class Confirmation(Base):
    """The fastest schedules of a workload timed again, interleaved rounds in one process (revision 0003).

    Its rounds are trials with ``confirmation_id`` set. Single measurements on a shared machine
    differ by tens of percent, so the fastest of many is biased low; the median of interleaved
    rounds is what :meth:`~rgtune.db.TrialDatabase.best` trusts. ``finished_at`` stays NULL
    when the confirmation was interrupted: best() ignores it then.
    """

    __tablename__ = "rg_confirmations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("rg_workloads.id"), index=True)
    schedules: Mapped[int] = mapped_column(Integer)
    rounds: Mapped[int] = mapped_column(Integer)
    worker: Mapped[str | None] = mapped_column(String(255))
    started_at: Mapped[datetime] = mapped_column(DateTime)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime)


class Verification(Base):
    """A schedule of a workload verified again on fresh inputs, each run more than once (revision 0004).

    One verification per trial can pass a kernel with a data race by luck; the schedule that
    :meth:`~rgtune.db.TrialDatabase.best` returns is checked again first, and a schedule with a
    failed re-verification is never returned.
    """

    __tablename__ = "rg_verifications"
    __table_args__ = (Index("ix_rg_verifications_workload_schedule", "workload_id", "schedule_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("rg_workloads.id"))
    schedule_id: Mapped[int] = mapped_column(ForeignKey("rg_schedules.id"))
    confirmation_id: Mapped[int | None] = mapped_column(ForeignKey("rg_confirmations.id"))
    status: Mapped[str] = mapped_column(String(16))  # ok or wrong_result
    inputs: Mapped[int] = mapped_column(Integer)  # fresh inputs checked
    runs: Mapped[int] = mapped_column(Integer)  # runs of each input
    max_error: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    source_hash: Mapped[str | None] = mapped_column(String(64))
    worker: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(DateTime)


class Trial(Base):
    """One measurement attempt of a schedule on a workload; written ``running`` before it starts."""

    __tablename__ = "rg_trials"
    __table_args__ = (
        # best(): WHERE workload_id = ? AND status = 'ok' ORDER BY median_ms; also count/stale scans.
        Index("ix_rg_trials_workload_status_median", "workload_id", "status", "median_ms"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("rg_workloads.id"))  # indexed by the composite below
    schedule_id: Mapped[int] = mapped_column(ForeignKey("rg_schedules.id"), index=True)
    optuna_trial: Mapped[int | None] = mapped_column(Integer)  # Optuna's trial number within the study
    status: Mapped[str] = mapped_column(String(16), index=True)
    median_ms: Mapped[float | None] = mapped_column(Float)
    times_ms: Mapped[list[float] | None] = mapped_column()  # every timed repeat
    compile_s: Mapped[float | None] = mapped_column(Float)
    max_error: Mapped[float | None] = mapped_column(Float)  # vs the float64 reference
    source_hash: Mapped[str | None] = mapped_column(String(64))
    rgtune_version: Mapped[str] = mapped_column(String(64))
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(DateTime)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime)
    # --- added by revision 0002
    predicted_ms: Mapped[float | None] = mapped_column(Float)  # the cost model's guess, before measuring
    worker: Mapped[str | None] = mapped_column(String(255))  # "host:pid" of the measuring process
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime)  # last sign of life while running
    # --- added by revision 0003
    confirmation_id: Mapped[int | None] = mapped_column(ForeignKey("rg_confirmations.id"), index=True)
    # --- added by revision 0006
    peak_bytes: Mapped[int | None] = mapped_column(BigInteger)  # memory growth over the trial (or estimated need)
    details: Mapped[dict[str, Any] | None] = mapped_column()  # what it verified, verify seconds, estimates...

    workload: Mapped[Workload] = relationship()
    schedule: Mapped[Schedule] = relationship(lazy="joined")
