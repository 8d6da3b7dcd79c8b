"""Trials: one worker id, a heartbeat, the cost model's prediction, an index for best().

Revision ID: 0002
Revises: 0001
Create Date: 2025-03-02

* ``worker`` ("host:pid") replaces ``host`` + ``pid``; existing rows are converted.
  Resuming after a kill -9 decides from it whether a ``running`` trial's process is dead.
* ``heartbeat_at``: the last sign of life of a running trial, for workers on other machines.
* ``predicted_ms``: the cost model's prediction, kept to score the model against measurements.
* ``ix_rg_trials_workload_status_median`` (workload, status, median) serves best(), counts and
  the stale-trial scan; it makes the single-column workload index redundant, which is dropped.

Written by hand: never import rgtune's ORM models here.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None

_trials = sa.table(
    "rg_trials",
    sa.column("id", sa.Integer()),
    sa.column("host", sa.String()),
    sa.column("pid", sa.Integer()),
    sa.column("worker", sa.String()),
)


def upgrade() -> None:
    with op.batch_alter_table("rg_trials") as batch:
        batch.add_column(sa.Column("predicted_ms", sa.Float(), nullable=True))
        batch.add_column(sa.Column("worker", sa.String(255), nullable=True))
        batch.add_column(sa.Column("heartbeat_at", sa.DateTime(), nullable=True))
    # "||" on SQLite and PostgreSQL alike; a NULL host or pid leaves worker NULL (unknown).
    op.execute(
        _trials.update()
        .where(_trials.c.host.is_not(None), _trials.c.pid.is_not(None))
        .values(worker=_trials.c.host + ":" + sa.cast(_trials.c.pid, sa.String()))
    )
    with op.batch_alter_table("rg_trials") as batch:
        batch.drop_index("ix_rg_trials_workload_id")
        batch.drop_column("host")
        batch.drop_column("pid")
        batch.create_index("ix_rg_trials_workload_status_median", ["workload_id", "status", "median_ms"])


def downgrade() -> None:
    with op.batch_alter_table("rg_trials") as batch:
        batch.add_column(sa.Column("host", sa.String(255), nullable=True))
        batch.add_column(sa.Column("pid", sa.Integer(), nullable=True))
    bind = op.get_bind()
    rows = bind.execute(sa.select(_trials.c.id, _trials.c.worker).where(_trials.c.worker.is_not(None))).all()
    for trial_id, worker in rows:
        host, _, pid = str(worker).rpartition(":")
        bind.execute(
            _trials.update()
            .where(_trials.c.id == trial_id)
            .values(host=host or None, pid=int(pid) if pid.isdigit() else None)
        )
    with op.batch_alter_table("rg_trials") as batch:
        batch.drop_index("ix_rg_trials_workload_status_median")
        batch.drop_column("heartbeat_at")
        batch.drop_column("worker")
        batch.drop_column("predicted_ms")
        batch.create_index("ix_rg_trials_workload_id", ["workload_id"])
