"""The tables of the manager's database (see :mod:`agentnest.server.db` for what each holds).

The schema is created and moved forward only by the Alembic migrations in
``agentnest/server/migrations``; a test compares the migrated database with these tables.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

from ..errors import MissingDependencyError

try:
    import sqlalchemy as sa
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise MissingDependencyError(
        "the manager's database needs SQLAlchemy and Alembic: pip install 'agentnest[server]'"
    ) from exc

metadata = sa.MetaData()
# SQLite's autoincrement needs INTEGER PRIMARY KEY; elsewhere 64 bits.
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

events = sa.Table(
    "events",
    metadata,
    sa.Column("id", _ID, primary_key=True, autoincrement=True),
    sa.Column("event_id", sa.String(64), nullable=False, unique=True),
    sa.Column("time", sa.Float, nullable=False),
    sa.Column("tenant", sa.String(64), nullable=False),
    sa.Column("token", sa.String(64), nullable=True),
    sa.Column("sandbox_id", sa.String(80), nullable=False, server_default=""),
    sa.Column("type", sa.String(64), nullable=False),
    sa.Column("actor", sa.String(16), nullable=False, server_default="host"),
    sa.Column("data", sa.JSON, nullable=False),
    sa.Index("ix_events_time", "time"),
    sa.Index("ix_events_tenant_time", "tenant", "time"),
    sa.Index("ix_events_sandbox_time", "sandbox_id", "time"),
    sa.Index("ix_events_type_time", "type", "time"),
)

sandboxes = sa.Table(
    "sandboxes",
    metadata,
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
    sa.Index("ix_sandboxes_tenant_started", "tenant", "started"),
    sa.Index("ix_sandboxes_ended", "ended"),
)


servers = sa.Table(
    "servers",
    metadata,
    sa.Column("server", sa.String(64), primary_key=True),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("version", sa.String(32), nullable=False),
    sa.Column("started", sa.Float, nullable=False),
    sa.Column("seen", sa.Float, nullable=False),
    sa.Column("url", sa.String(255), nullable=True),
    sa.Index("ix_servers_seen", "seen"),
)


holds = sa.Table(
    "holds",
    metadata,
    sa.Column("hold", sa.String(40), primary_key=True),
    sa.Column("server", sa.String(64), nullable=False),
    sa.Column("tenant", sa.String(64), nullable=False),
    sa.Column("sandboxes", sa.Integer, nullable=False),
    sa.Column("memory", sa.BigInteger, nullable=False),
    sa.Column("cpus", sa.Float, nullable=False),
    sa.Column("since", sa.Float, nullable=False),
    sa.Index("ix_holds_server", "server"),
    sa.Index("ix_holds_tenant", "tenant"),
)

usage = sa.Table(
    "usage",
    metadata,
    # Each tenant's decayed dominant-share-seconds on each replica (agentnest.server.fairshare),
    # as of ``stamp`` (wall clock): the sum over servers is the tenant's usage on all of them.
    sa.Column("server", sa.String(64), primary_key=True),
    sa.Column("tenant", sa.String(64), primary_key=True),
    sa.Column("value", sa.Float, nullable=False),
    sa.Column("stamp", sa.Float, nullable=False),
)

leases = sa.Table(
    "leases",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("holder", sa.String(64), nullable=False),
    sa.Column("expires", sa.Float, nullable=False),
)


def first_line(exc: BaseException) -> str:
    """The first line of a database error (the driver's message, without SQLAlchemy's trailer)."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


__all__ = ["events", "first_line", "holds", "leases", "metadata", "sandboxes", "servers", "usage"]
