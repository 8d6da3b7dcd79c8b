"""The precision policy in the workload key: a study that may store intermediates in 16 bits is another workload.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27

* ``rg_workloads.precision``: the storage types the workload's schedules may use (``tune --precision``:
  ``fp32``, ``bf16``, ``fp16``, ``any``), part of the workload's unique key: the best schedule allowed to
  round its intermediates to bfloat16 is not a float32 layer's best. Rows from before read ``fp32``.

Written by hand: never import rgtune's ORM models here.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None

_OLD_KEY = ["model", "in_dim", "out_dim", "heads", "graph_id", "device_id", "backend", "mode", "options", "batches"]


def upgrade() -> None:
    with op.batch_alter_table("rg_workloads") as batch:
        batch.add_column(sa.Column("precision", sa.String(16), nullable=False, server_default="fp32"))
        batch.drop_constraint("uq_rg_workloads_key", type_="unique")
        batch.create_unique_constraint("uq_rg_workloads_key", [*_OLD_KEY, "precision"])


def downgrade() -> None:
    bind = op.get_bind()
    low = bind.execute(sa.text("SELECT COUNT(*) FROM rg_workloads WHERE precision <> 'fp32'")).scalar()
    if low:
        raise RuntimeError(f"cannot downgrade below 0008: {low} workload(s) were tuned with 16-bit storage allowed, "
                           "which the older schema cannot tell apart from float32 ones")
    with op.batch_alter_table("rg_workloads") as batch:
        batch.drop_constraint("uq_rg_workloads_key", type_="unique")
        batch.create_unique_constraint("uq_rg_workloads_key", _OLD_KEY)
        batch.drop_column("precision")
