"""Confirmations: the fastest schedules of a study timed again, side by side.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24

* ``rg_confirmations``: one row per confirmation of a workload (how many schedules, how many
  interleaved rounds, when it started and finished; an interrupted one never finishes).
* ``rg_trials.confirmation_id``: the confirmation a trial is a round of (NULL for the trials
  of the search). ``best()`` reads the latest finished confirmation.

Written by hand: never import rgtune's ORM models here.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "rg_confirmations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("schedules", sa.Integer(), nullable=False),
        sa.Column("rounds", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(255), nullable=True),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["workload_id"], ["rg_workloads.id"],
                                name="fk_rg_confirmations_workload_id_rg_workloads"),
        sa.PrimaryKeyConstraint("id", name="pk_rg_confirmations"),
    )
    op.create_index("ix_rg_confirmations_workload_id", "rg_confirmations", ["workload_id"])
    with op.batch_alter_table("rg_trials") as batch:
        batch.add_column(sa.Column("confirmation_id", sa.Integer(), nullable=True))
        batch.create_foreign_key("fk_rg_trials_confirmation_id_rg_confirmations", "rg_confirmations",
                                 ["confirmation_id"], ["id"])
        batch.create_index("ix_rg_trials_confirmation_id", ["confirmation_id"])


def downgrade() -> None:
    with op.batch_alter_table("rg_trials") as batch:
        batch.drop_index("ix_rg_trials_confirmation_id")
        batch.drop_constraint("fk_rg_trials_confirmation_id_rg_confirmations", type_="foreignkey")
        batch.drop_column("confirmation_id")
    op.drop_index("ix_rg_confirmations_workload_id", table_name="rg_confirmations")
    op.drop_table("rg_confirmations")
