"""The manager's database: audit history and usage, through SQLAlchemy 2 and Alembic.

SQLite (a file under the server's state directory) is the embedded default,
for one server; PostgreSQL (``postgresql://...``, driver ``psycopg``) is for
several replicas sharing one history.  The schema is created and moved
forward only by the Alembic migrations in ``agentnest/server/migrations``
(``agentnest serve db upgrade``, or at server start unless ``--no-migrate``).

Five tables:

``events``
    Every event the guard emits for a sandbox of the manager, tagged with the
    tenant and token that own it, plus the admission decisions
    (``admission.admitted``, ``admission.rejected``; no sandbox id).  Ordered
    by ``id``, the cursor of the paged query API.
``sandboxes``
    One row per sandbox the manager started: who, what it holds (memory,
    CPUs), when it started and ended.  Usage (sandbox-, CPU- and
    memory-seconds) is computed from it over any time window.
``servers``
    The servers writing here, each with a heartbeat: the sandboxes of one
    that stopped answering (killed, its host gone) are ended by the others.
``holds``
    On PostgreSQL, what every replica has granted and not released (one row
    per grant: tenant, sandboxes, memory, CPUs): admission across replicas is
    one transaction over it (:meth:`Database.hold`), so no two replicas grant
    the same room.
``leases``
    Named leases with a holder and an expiry: the leader among replicas
    (:meth:`Database.lead`).

Everything here is synchronous (the server calls it in worker threads,
:mod:`agentnest.server.recorder`); every failure to reach the database is a
:class:`~agentnest.errors.RuntimeNotAvailableError` naming the database.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .._version import __version__
from ..errors import ConfigurationError, MissingDependencyError, RuntimeNotAvailableError

try:
    import sqlalchemy as sa
    from sqlalchemy.engine import URL, Connection, Engine, make_url
    from sqlalchemy.exc import ArgumentError, IntegrityError, SQLAlchemyError
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise MissingDependencyError(
        "the manager's database needs SQLAlchemy and Alembic: pip install 'agentnest[server]'"
    ) from exc

#: The migrations (an Alembic script directory) shipped in the package.
MIGRATIONS = Path(__file__).with_name("migrations")
#: Key of the PostgreSQL advisory lock held while migrating: replicas starting
#: together migrate one after the other, never twice at once.
_MIGRATION_LOCK = 0x41474E53  # "AGNS"
#: Rows written per INSERT statement.
_BATCH = 500
#: Largest page of the query API.
MAX_PAGE = 1000

# After the guard above: these need SQLAlchemy too.
from .db_replicas import ReplicaQueries  # noqa: E402
from .db_tables import events, first_line, sandboxes  # noqa: E402


def default_database_url() -> str:
    """``$AGENTNEST_DATABASE_URL``, else a SQLite file ``manager.db`` beside the audit log.

    That is ``$XDG_STATE_HOME/agentnest/manager.db`` (``~/.local/state/agentnest``).
    """
    explicit = os.environ.get("AGENTNEST_DATABASE_URL")
    if explicit:
        return explicit
    state = os.environ.get("XDG_STATE_HOME") or os.path.join("~", ".local", "state")
    return f"sqlite:///{Path(state).expanduser() / 'agentnest' / 'manager.db'}"


def parse_url(text: str) -> URL:
    """A database URL, checked: ``sqlite:///PATH`` or ``postgresql://USER:PASS@HOST:PORT/DB``.

    ``postgresql://`` means the ``psycopg`` (3) driver.  A bare path is a SQLite file.
    """
    text = text.strip()
    if not text:
        raise ConfigurationError("the database URL is empty; use sqlite:///PATH or postgresql://...")
    if "://" not in text:
        text = f"sqlite:///{Path(text).expanduser().absolute()}"
    try:
        url = make_url(text)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise ConfigurationError(
            f"{_redact(text)} is not a database URL; use sqlite:///PATH or postgresql://USER@HOST:PORT/DB"
        ) from None
    backend = url.get_backend_name()
    if backend == "postgresql":
        driver = url.get_driver_name()
        if driver not in ("psycopg", "psycopg2") and "+" in url.drivername:
            raise ConfigurationError(f"database driver {driver!r} is not supported; use postgresql://...")
        if "+" not in url.drivername:
            url = url.set(drivername="postgresql+psycopg")
        if not url.database:
            raise ConfigurationError(f"{_redact(text)} names no database: postgresql://USER@HOST:PORT/DB")
        return url
    if backend == "sqlite":
        if not url.database or url.database == ":memory:":
            # Each pooled connection would get its own empty in-memory database.
            raise ConfigurationError("the database must be a SQLite file (sqlite:///PATH), not in memory")
        return url
    raise ConfigurationError(
        f"database {backend!r} is not supported: "
        "use sqlite:///PATH (one server) or postgresql://... (replicas)"
    )


def _redact(url: str | URL) -> str:
    """The URL without its password (it is printed in errors and logs)."""
    try:
        parsed = url if isinstance(url, URL) else make_url(url)
    except (ArgumentError, ValueError):
        return "<the database URL>"
    return parsed.render_as_string(hide_password=True)


@dataclasses.dataclass(frozen=True, slots=True)
class EventQuery:
    """Filters of :meth:`Database.events` (every field optional; all must match)."""

    tenant: str | None = None
    sandbox_id: str | None = None
    types: Sequence[str] = ()
    since: float | None = None
    until: float | None = None
    after: int = 0
    """Only rows with a greater ``id`` (the cursor of the previous page)."""
    limit: int = 100


@dataclasses.dataclass(frozen=True, slots=True)
class Usage:
    """What one tenant used over a window (seconds are wall-clock, while held)."""

    tenant: str
    creates: int
    sandbox_seconds: float
    cpu_seconds: float
    memory_gib_seconds: float
    rejections: int


class Database(ReplicaQueries):
    """One database (SQLite or PostgreSQL), its migrations and the manager's queries.

    Args:
        url: ``sqlite:///PATH``, ``postgresql://...`` or a file path (see :func:`parse_url`).
        connect_timeout: seconds to wait for a connection before the database counts as down.
    """

    def __init__(self, url: str, *, connect_timeout: float = 5.0) -> None:
        self.url = parse_url(url)
        self.dialect = self.url.get_backend_name()
        args: dict[str, Any] = {}
        if self.dialect == "sqlite":
            path = Path(str(self.url.database)).expanduser()
            try:
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            except OSError as exc:
                raise ConfigurationError(
                    f"cannot create the database's directory {path.parent}: {exc}"
                ) from None
            # Waits for a writer holding the file instead of failing at once.
            args["timeout"] = connect_timeout
        else:
            try:
                import psycopg  # noqa: F401
            except ImportError:
                raise MissingDependencyError(
                    "a PostgreSQL database needs psycopg: pip install 'agentnest[postgres]'"
                ) from None
            args["connect_timeout"] = max(1, round(connect_timeout))
        self.engine: Engine = sa.create_engine(self.url, connect_args=args, pool_pre_ping=True)
        # Grants across replicas are on every create's path: no ping before each (a round trip
        # of three); a connection the server dropped fails its first try and the grant is
        # retried once on a fresh one (SQLAlchemy's optimistic disconnect handling).
        self._grants: Engine = (
            sa.create_engine(self.url, connect_args=args) if self.dialect == "postgresql" else self.engine
        )
        if self.dialect == "sqlite":
            sa.event.listen(self.engine, "connect", _sqlite_pragmas)
        self._closed = False
        for engine in {self.engine, self._grants}:
            sa.event.listen(engine, "checkin", self._checkin)

    def _checkin(self, dbapi_connection: Any, _record: Any) -> None:
        # A connection still checked out when close() disposed the pool (a query in a worker
        # thread abandoned at shutdown) comes back to the old pool, which would keep it open
        # until the garbage collector found it: close it now.
        if self._closed:
            dbapi_connection.close()

    def __repr__(self) -> str:
        return f"Database({self.display!r})"

    @property
    def display(self) -> str:
        """The URL with its password hidden."""
        return _redact(self.url)

    @contextmanager
    def _begin(self) -> Iterator[Connection]:
        try:
            with self.engine.begin() as conn:
                yield conn
        except IntegrityError:
            raise
        except SQLAlchemyError as exc:
            raise RuntimeNotAvailableError(
                f"the manager's database {self.display} failed: {first_line(exc)}"
            ) from exc

    def close(self) -> None:
        self._closed = True
        self.engine.dispose()
        self._grants.dispose()

    # -- migrations ----------------------------------------------------------------

    def _alembic(self, conn: Connection | None = None) -> Any:
        return _config(conn)

    def head(self) -> str:
        """The newest migration this version of agentnest ships."""
        return _shipped()[-1]

    def revision(self) -> str | None:
        """The migration the database is at (``None``: never migrated)."""
        from alembic.runtime.migration import MigrationContext

        with self._begin() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    def upgrade(self) -> tuple[str | None, str]:
        """Migrate to the newest schema; returns (revision before, revision after).

        Safe to run from several replicas at once: on PostgreSQL an advisory lock
        serialises them, and the second finds nothing left to do.
        """
        from alembic import command

        with self._begin() as conn:
            if self.dialect == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
            from alembic.runtime.migration import MigrationContext

            before = MigrationContext.configure(conn).get_current_revision()
            self._known(before)
            command.upgrade(self._alembic(conn), "head")
        return before, self.head()

    def _known(self, revision: str | None) -> None:
        """Raise if ``revision`` is not one of ours: a newer agentnest migrated the database."""
        if revision is None:
            return
        if revision not in _shipped():
            raise RuntimeNotAvailableError(
                f"the manager's database {self.display} is at migration {revision}, which agentnest "
                f"{__version__} does not know (a newer agentnest migrated it); run that version or a "
                "newer one against this database, never an older one"
            )

    def check(self) -> None:
        """Raise unless the database answers and its schema is the newest (for ``/readyz``)."""
        current = self.revision()
        self._known(current)
        if current != self.head():
            raise RuntimeNotAvailableError(
                f"the manager's database {self.display} is at migration {current or 'none'}, "
                f"this server needs {self.head()}: run `agentnest serve db upgrade`"
            )

    # -- writes ----------------------------------------------------------------------

    def apply(self, ops: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
        """Write a batch in one transaction, in order: ``("event"|"start"|"end", row)``.

        An event already written (same ``event_id``: a retry after a commit whose
        answer was lost) is skipped, never duplicated.
        """
        try:
            with self._begin() as conn:
                self._apply(conn, ops)
        except IntegrityError:
            with self._begin() as conn:
                self._apply(conn, ops, one_by_one=True)

    def _apply(
        self, conn: Connection, ops: Sequence[tuple[str, Mapping[str, Any]]], one_by_one: bool = False
    ) -> None:
        pending: list[Mapping[str, Any]] = []

        def flush() -> None:
            if not pending:
                return
            if one_by_one:
                for row in pending:
                    seen = conn.execute(
                        sa.select(events.c.id).where(events.c.event_id == row["event_id"])
                    ).first()
                    if seen is None:
                        conn.execute(events.insert(), [row])
            else:
                for i in range(0, len(pending), _BATCH):
                    conn.execute(events.insert(), list(pending[i : i + _BATCH]))
            pending.clear()

        for kind, row in ops:
            if kind == "event":
                pending.append(row)
                continue
            flush()
            if kind == "start":
                exists = conn.execute(
                    sa.select(sandboxes.c.sandbox_id).where(sandboxes.c.sandbox_id == row["sandbox_id"])
                ).first()
                if exists is None:
                    conn.execute(sandboxes.insert(), [dict(row)])
            elif kind == "end":
                # A row another server presumed lost (this one missed its heartbeats) gets its
                # true end; any other end is final.
                conn.execute(
                    sandboxes.update()
                    .where(
                        sandboxes.c.sandbox_id == row["sandbox_id"],
                        sa.or_(sandboxes.c.ended.is_(None), sandboxes.c.end_reason == "lost"),
                    )
                    .values(ended=row["ended"], end_reason=row["reason"])
                )
            else:  # pragma: no cover - the recorder writes only these
                raise ValueError(f"unknown database operation {kind!r}")
        flush()

    def close_open(self, server: str | None = None, *, reason: str = "lost") -> int:
        """End sandbox rows left open by a server that stopped without ending them.

        Each ends at its last recorded event (or its start): no usage is invented
        for the time nobody watched it.  ``server`` limits it to one server's rows.
        """
        where: list[sa.ColumnElement[bool]] = []
        if server is not None:
            where.append(sandboxes.c.server == server)
        with self._begin() as conn:
            return self._close(conn, where, reason)

    def prune(self, before: float) -> int:
        """Delete events older than ``before`` and sandboxes that ended before it; the count."""
        with self._begin() as conn:
            gone = conn.execute(events.delete().where(events.c.time < before)).rowcount or 0
            gone += (
                conn.execute(
                    sandboxes.delete().where(sandboxes.c.ended.is_not(None), sandboxes.c.ended < before)
                ).rowcount
                or 0
            )
        return int(gone)

    # -- reads -------------------------------------------------------------------------

    def events(self, query: EventQuery) -> list[dict[str, Any]]:
        """One page of events, oldest first, as the query API returns them (``id`` is the cursor)."""
        q = sa.select(events).where(events.c.id > query.after)
        if query.tenant is not None:
            q = q.where(events.c.tenant == query.tenant)
        if query.sandbox_id:
            q = q.where(events.c.sandbox_id.startswith(query.sandbox_id, autoescape=True))
        if query.types:
            q = q.where(events.c.type.in_(list(query.types)))
        if query.since is not None:
            q = q.where(events.c.time >= query.since)
        if query.until is not None:
            q = q.where(events.c.time < query.until)
        q = q.order_by(events.c.id).limit(max(1, min(query.limit, MAX_PAGE)))
        with self._begin() as conn:
            rows = conn.execute(q).mappings().all()
        return [
            {
                "id": row["id"],
                "event_id": row["event_id"],
                "time": row["time"],
                "tenant": row["tenant"],
                "token": row["token"],
                "sandbox_id": row["sandbox_id"],
                "type": row["type"],
                "actor": row["actor"],
                "data": row["data"],
            }
            for row in rows
        ]

    def usage(self, since: float, until: float | None = None, tenant: str | None = None) -> list[Usage]:
        """Usage per tenant over ``[since, until)`` (``until``: now); open sandboxes count to now."""
        now = time.time()
        until = now if until is None else until
        if until <= since:
            raise ConfigurationError("the usage window is empty: until must be after since")
        end = sa.func.coalesce(sandboxes.c.ended, now)
        # Overlap of [started, end) with [since, until), portable (no LEAST/GREATEST in SQLite).
        upper = sa.case((end < until, end), else_=until)
        lower = sa.case((sandboxes.c.started > since, sandboxes.c.started), else_=since)
        held = sa.case((upper > lower, upper - lower), else_=0.0)
        overlapping = sa.and_(sandboxes.c.started < until, end > since)
        q = (
            sa.select(
                sandboxes.c.tenant,
                sa.func.sum(sa.case((sandboxes.c.started >= since, 1), else_=0)).label("creates"),
                sa.func.sum(held).label("seconds"),
                sa.func.sum(held * sandboxes.c.cpus).label("cpu"),
                sa.func.sum(held * sandboxes.c.memory).label("memory"),
            )
            .where(overlapping)
            .group_by(sandboxes.c.tenant)
        )
        rejected = (
            sa.select(events.c.tenant, sa.func.count().label("n"))
            .where(events.c.type == "admission.rejected", events.c.time >= since, events.c.time < until)
            .group_by(events.c.tenant)
        )
        if tenant is not None:
            q = q.where(sandboxes.c.tenant == tenant)
            rejected = rejected.where(events.c.tenant == tenant)
        with self._begin() as conn:
            held_rows = {row.tenant: row for row in conn.execute(q)}
            rejections = {row.tenant: int(row.n) for row in conn.execute(rejected)}
        out = []
        for name in sorted(set(held_rows) | set(rejections)):
            row = held_rows.get(name)
            out.append(
                Usage(
                    tenant=name,
                    creates=int(row.creates or 0) if row else 0,
                    sandbox_seconds=float(row.seconds or 0.0) if row else 0.0,
                    cpu_seconds=float(row.cpu or 0.0) if row else 0.0,
                    memory_gib_seconds=float(row.memory or 0.0) / 2**30 if row else 0.0,
                    rejections=rejections.get(name, 0),
                )
            )
        return out


@functools.cache
def _shipped() -> tuple[str, ...]:
    """The migrations in the package, oldest first (read from disk once: /readyz and every
    health check of a create ask for them)."""
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory.from_config(_config()).walk_revisions()
    return tuple(reversed([script.revision for script in scripts]))


def _config(conn: Connection | None = None) -> Any:
    """Alembic's configuration: our migrations, run on ``conn`` (see migrations/env.py)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = conn
    return config


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # WAL: readers (the query API) never block the writer; one server only
    # (WAL does not work over a network filesystem, hence PostgreSQL for replicas).
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
