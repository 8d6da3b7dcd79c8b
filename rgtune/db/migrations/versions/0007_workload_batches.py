"""The sampler in the workload key: a schedule tuned on mini-batches is another workload.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27

* ``rg_workloads.batches``: the sampler the workload's trials were timed on, canonical text
  (``neighbor:fanout=15x10,batch_size=1024``), part of the workload's unique key: the best
  schedule for a sampled subgraph need not be the best for the whole graph. Rows from before
  samplers existed read ``""``: tuned on the whole graph.

Written by hand: never import rgtune's ORM models here.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None

_OLD_KEY = ["model", "in_dim", "out_dim", "heads", "graph_id", "device_id", "backend", "mode", "options"]


def upgrade() -> None:
    with op.batch_alter_table("rg_workloads") as batch:
        batch.add_column(sa.Column("batches", sa.String(255), nullable=False, server_default=""))
        batch.drop_constraint("uq_rg_workloads_key", type_="unique")
        batch.create_unique_constraint("uq_rg_workloads_key", [*_OLD_KEY, "batches"])


def downgrade() -> None:
    bind = op.get_bind()
    batched = bind.execute(sa.text("SELECT COUNT(*) FROM rg_workloads WHERE batches <> ''")).scalar()
    if batched:
        raise RuntimeError(f"cannot downgrade below 0007: {batched} workload(s) were tuned on mini-batches, which "
                           "the older schema cannot tell apart from the whole graph")
    with op.batch_alter_table("rg_workloads") as batch:
        batch.drop_constraint("uq_rg_workloads_key", type_="unique")
        batch.create_unique_constraint("uq_rg_workloads_key", _OLD_KEY)
        batch.drop_column("batches")
