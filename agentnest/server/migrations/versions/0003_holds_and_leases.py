"""What every replica holds (admission across replicas) and the leader's lease.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "holds",
        sa.Column("hold", sa.String(40), primary_key=True),
        sa.Column("server", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("sandboxes", sa.Integer, nullable=False),
        sa.Column("memory", sa.BigInteger, nullable=False),
        sa.Column("cpus", sa.Float, nullable=False),
        sa.Column("since", sa.Float, nullable=False),
    )
    op.create_index("ix_holds_server", "holds", ["server"])
    op.create_index("ix_holds_tenant", "holds", ["tenant"])
    op.create_table(
        "leases",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("holder", sa.String(64), nullable=False),
        sa.Column("expires", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("leases")
    op.drop_table("holds")
