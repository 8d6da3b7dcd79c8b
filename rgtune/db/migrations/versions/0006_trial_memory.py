"""Trials: their peak memory and what the trial checked and measured besides the times.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26

* ``rg_trials.peak_bytes``: the measuring process's memory growth over the trial (host RSS on a CPU
  backend, allocated device memory on CUDA), or, for a candidate refused before running, its
  estimated need; NULL where not measured (older rows).
* ``rg_trials.details``: JSON of the trial's measurement besides its times: what verification
  covered (all rows, or the sampled rows, nodes and edges), its tolerance where raised, seconds spent
  verifying, the estimated memory, the first run of a stopped candidate. NULL for older rows.

Written by hand: never import rgtune's ORM models here.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("rg_trials") as batch:
        batch.add_column(sa.Column("peak_bytes", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("details", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rg_trials") as batch:
        batch.drop_column("details")
        batch.drop_column("peak_bytes")
