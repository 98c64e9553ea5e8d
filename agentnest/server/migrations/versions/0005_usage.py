"""Each tenant's remembered usage on each replica (weighted fair share over time, issue 33).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "usage",
        sa.Column("server", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(64), primary_key=True),
        sa.Column("value", sa.Float, nullable=False),
        sa.Column("stamp", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("usage")
