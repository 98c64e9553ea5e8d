"""The audit history (events) and usage (sandboxes) of the manager.

Revision ID: 0001
Revises:
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# A migration is a frozen copy of the schema as it was at its revision: it never imports the
# tables of agentnest/server/db.py, which move on with later migrations.  A test compares the
# migrated database with those tables, so the two cannot drift apart unnoticed.
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.String(64), nullable=False, unique=True),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("token", sa.String(64), nullable=True),
        sa.Column("sandbox_id", sa.String(80), nullable=False, server_default=""),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("actor", sa.String(16), nullable=False, server_default="host"),
        sa.Column("data", sa.JSON, nullable=False),
    )
    op.create_index("ix_events_time", "events", ["time"])
    op.create_index("ix_events_tenant_time", "events", ["tenant", "time"])
    op.create_index("ix_events_sandbox_time", "events", ["sandbox_id", "time"])
    op.create_index("ix_events_type_time", "events", ["type", "time"])
    op.create_table(
        "sandboxes",
        sa.Column("sandbox_id", sa.String(80), primary_key=True),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("token", sa.String(64), nullable=True),
        sa.Column("backend", sa.String(64), nullable=False),
        sa.Column("image", sa.String(255), nullable=False),
        sa.Column("launch", sa.String(8), nullable=False),
        sa.Column("memory", sa.BigInteger, nullable=False),
        sa.Column("cpus", sa.Float, nullable=False),
        sa.Column("started", sa.Float, nullable=False),
        sa.Column("ended", sa.Float, nullable=True),
        sa.Column("end_reason", sa.String(32), nullable=True),
        sa.Column("server", sa.String(64), nullable=False),
    )
    op.create_index("ix_sandboxes_tenant_started", "sandboxes", ["tenant", "started"])
    op.create_index("ix_sandboxes_ended", "sandboxes", ["ended"])


def downgrade() -> None:
    op.drop_table("sandboxes")
    op.drop_table("events")
