"""Verifications: a schedule checked again on fresh inputs before it is trusted as the best.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26

* ``rg_verifications``: one row per re-verification of a schedule of a workload: how many fresh
  inputs, how many runs of each, the outcome (``ok`` or ``wrong_result``), the largest error,
  the error message, the generated sources' hash, the confirmation it belongs to (if any), who
  ran it and when. ``best()`` never returns a schedule with a failed re-verification.

Written by hand: never import rgtune's ORM models here.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "rg_verifications",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("schedule_id", sa.Integer(), nullable=False),
        sa.Column("confirmation_id", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("inputs", sa.Integer(), nullable=False),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("max_error", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("source_hash", sa.String(64), nullable=True),
        sa.Column("worker", sa.String(255), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["workload_id"], ["rg_workloads.id"],
                                name="fk_rg_verifications_workload_id_rg_workloads"),
        sa.ForeignKeyConstraint(["schedule_id"], ["rg_schedules.id"],
                                name="fk_rg_verifications_schedule_id_rg_schedules"),
        sa.ForeignKeyConstraint(["confirmation_id"], ["rg_confirmations.id"],
                                name="fk_rg_verifications_confirmation_id_rg_confirmations"),
        sa.PrimaryKeyConstraint("id", name="pk_rg_verifications"),
    )
    op.create_index("ix_rg_verifications_workload_schedule", "rg_verifications", ["workload_id", "schedule_id"])


def downgrade() -> None:
    op.drop_index("ix_rg_verifications_workload_schedule", table_name="rg_verifications")
    op.drop_table("rg_verifications")
