"""Model options in the workload key; model names as long as an import path.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26

* ``rg_workloads.options``: the model's options, canonical text (the non-default ones, sorted,
  ``name=value`` joined by commas; see ``rgtune.ir.registry``), part of the workload's unique key.
  Rows from before options existed read ``""``: no options, the model as it was.
* ``rg_workloads.model`` widens to 255 characters: a model may be named by its import path
  (``package.module:builder``).

Written by hand: never import rgtune's ORM models here.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None

_OLD_KEY = ["model", "in_dim", "out_dim", "heads", "graph_id", "device_id", "backend", "mode"]


def upgrade() -> None:
    with op.batch_alter_table("rg_workloads") as batch:
        batch.add_column(sa.Column("options", sa.String(255), nullable=False, server_default=""))
        batch.alter_column("model", type_=sa.String(255), existing_type=sa.String(32), existing_nullable=False)
        batch.drop_constraint("uq_rg_workloads_key", type_="unique")
        batch.create_unique_constraint("uq_rg_workloads_key", [*_OLD_KEY, "options"])


def downgrade() -> None:
    bind = op.get_bind()
    optioned = bind.execute(sa.text("SELECT COUNT(*) FROM rg_workloads WHERE options <> ''")).scalar()
    if optioned:
        raise RuntimeError(f"cannot downgrade below 0005: {optioned} workload(s) have model options, which the "
                           "older schema cannot tell apart")
    with op.batch_alter_table("rg_workloads") as batch:
        batch.drop_constraint("uq_rg_workloads_key", type_="unique")
        batch.create_unique_constraint("uq_rg_workloads_key", _OLD_KEY)
        batch.alter_column("model", type_=sa.String(32), existing_type=sa.String(255), existing_nullable=False)
        batch.drop_column("options")
