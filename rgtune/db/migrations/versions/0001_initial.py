"""Initial schema: devices, graphs, workloads, schedules, trials.

Revision ID: 0001
Revises:
Create Date: 2025-01-15

The first released layout. A trial recorded the measuring process as ``host`` + ``pid``;
revision 0002 replaces them by one ``worker`` id and adds what resuming and the cost model need.
Written by hand: never import rgtune's ORM models here.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "rg_devices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("architecture", sa.String(100), nullable=False),
        sa.Column("runtime", sa.String(200), nullable=False),
        sa.Column("compiler", sa.String(200), nullable=False),
        sa.Column("backend", sa.String(32), nullable=False),
        sa.Column("extra", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_rg_devices"),
        sa.UniqueConstraint("fingerprint", name="uq_rg_devices_fingerprint"),
    )
    op.create_table(
        "rg_graphs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("stats", sa.JSON(), nullable=False),
        sa.Column("num_nodes", sa.BigInteger(), nullable=False),
        sa.Column("num_edges", sa.BigInteger(), nullable=False),
        sa.Column("num_rels", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_rg_graphs"),
        sa.UniqueConstraint("content_hash", name="uq_rg_graphs_content_hash"),
    )
    op.create_index("ix_rg_graphs_name", "rg_graphs", ["name"])
    op.create_table(
        "rg_schedules",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("knobs", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_rg_schedules"),
        sa.UniqueConstraint("hash", name="uq_rg_schedules_hash"),
    )
    op.create_table(
        "rg_workloads",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(32), nullable=False),
        sa.Column("in_dim", sa.Integer(), nullable=False),
        sa.Column("out_dim", sa.Integer(), nullable=False),
        sa.Column("heads", sa.Integer(), nullable=False),
        sa.Column("graph_id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("backend", sa.String(32), nullable=False),
        sa.Column("mode", sa.String(32), nullable=False),
        sa.Column("study_name", sa.String(255), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["graph_id"], ["rg_graphs.id"], name="fk_rg_workloads_graph_id_rg_graphs"),
        sa.ForeignKeyConstraint(["device_id"], ["rg_devices.id"], name="fk_rg_workloads_device_id_rg_devices"),
        sa.PrimaryKeyConstraint("id", name="pk_rg_workloads"),
        sa.UniqueConstraint(
            "model", "in_dim", "out_dim", "heads", "graph_id", "device_id", "backend", "mode", name="uq_rg_workloads_key"
        ),
        sa.UniqueConstraint("study_name", name="uq_rg_workloads_study_name"),
    )
    op.create_index("ix_rg_workloads_graph_id", "rg_workloads", ["graph_id"])
    op.create_index("ix_rg_workloads_device_id", "rg_workloads", ["device_id"])
    op.create_table(
        "rg_trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("schedule_id", sa.Integer(), nullable=False),
        sa.Column("optuna_trial", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("median_ms", sa.Float(), nullable=True),
        sa.Column("times_ms", sa.JSON(), nullable=True),
        sa.Column("compile_s", sa.Float(), nullable=True),
        sa.Column("max_error", sa.Float(), nullable=True),
        sa.Column("source_hash", sa.String(64), nullable=True),
        sa.Column("rgtune_version", sa.String(64), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("host", sa.String(255), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["workload_id"], ["rg_workloads.id"], name="fk_rg_trials_workload_id_rg_workloads"),
        sa.ForeignKeyConstraint(["schedule_id"], ["rg_schedules.id"], name="fk_rg_trials_schedule_id_rg_schedules"),
        sa.PrimaryKeyConstraint("id", name="pk_rg_trials"),
    )
    op.create_index("ix_rg_trials_workload_id", "rg_trials", ["workload_id"])
    op.create_index("ix_rg_trials_schedule_id", "rg_trials", ["schedule_id"])
    op.create_index("ix_rg_trials_status", "rg_trials", ["status"])


def downgrade() -> None:
    op.drop_table("rg_trials")
    op.drop_table("rg_workloads")
    op.drop_table("rg_schedules")
    op.drop_table("rg_graphs")
    op.drop_table("rg_devices")
