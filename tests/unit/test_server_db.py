"""The manager's database (agentnest.server.db) on SQLite and on a private PostgreSQL server:
migrations, idempotent writes, the paged event query, usage over windows, retention and the
rows a crashed server left open.  No engine."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from agentnest.errors import ConfigurationError, RuntimeNotAvailableError
from agentnest.server.db import Database, EventQuery, default_database_url, parse_url

pytestmark = pytest.mark.timeout(120)

GIB = 1 << 30


def event(tenant: str = "a", sandbox: str = "sb-1", type: str = "exec", at: float | None = None) -> Any:
    return (
        "event",
        {
            "event_id": uuid.uuid4().hex,
            "time": time.time() if at is None else at,
            "tenant": tenant,
            "token": "tok",
            "sandbox_id": sandbox,
            "type": type,
            "actor": "agent",
            "data": {"command": "echo hi", "exit_code": 0, "nested": {"a": [1, 2]}},
        },
    )


def start(sandbox: str, tenant: str, started: float, memory: int = GIB, cpus: float = 1.0) -> Any:
    return (
        "start",
        {
            "sandbox_id": sandbox,
            "tenant": tenant,
            "token": "tok",
            "backend": "docker",
            "image": "img",
            "launch": "cold",
            "memory": memory,
            "cpus": cpus,
            "started": started,
            "server": "srv-1",
        },
    )


def end(sandbox: str, ended: float, reason: str = "destroyed") -> Any:
    return ("end", {"sandbox_id": sandbox, "ended": ended, "reason": reason})


def test_upgrade_creates_the_schema_once_and_reports_where_it_is(database_url: str) -> None:
    database = Database(database_url)
    try:
        assert database.revision() is None
        with pytest.raises(RuntimeNotAvailableError, match="serve db upgrade"):
            database.check()
        before, after = database.upgrade()
        assert before is None and after == database.head() == database.revision()
        database.check()
        assert database.upgrade() == (after, after)  # a second run has nothing to do
        tables = set(sa.inspect(database.engine).get_table_names())
        assert {"events", "sandboxes", "alembic_version"} <= tables
    finally:
        database.close()


def test_a_batch_written_twice_stores_each_event_once(db: Database) -> None:
    batch = [event(), start("sb-1", "a", time.time()), event(), end("sb-1", time.time())]
    db.apply(batch)
    db.apply(batch)  # a retry after a commit whose answer was lost
    rows = db.events(EventQuery(limit=100))
    assert len(rows) == 2
    assert rows[0]["data"] == {"command": "echo hi", "exit_code": 0, "nested": {"a": [1, 2]}}
    assert rows[0]["id"] < rows[1]["id"]
    # The end of a sandbox is written once: a second end keeps the first.
    db.apply([end("sb-1", time.time() + 100, "deadline")])
    usage = db.usage(time.time() - 60, time.time() + 200)
    assert usage[0].creates == 1 and usage[0].sandbox_seconds < 5


def test_the_event_query_filters_and_pages_by_cursor(db: Database) -> None:
    now = time.time()
    db.apply(
        [event("a", "sb-aa1", "exec", now - 30), event("b", "sb-bb1", "exec", now - 20)]
        + [event("a", "sb-aa2", "write_file", now - 10 + i) for i in range(5)]
    )
    assert {r["tenant"] for r in db.events(EventQuery(tenant="b"))} == {"b"}
    assert [r["sandbox_id"] for r in db.events(EventQuery(sandbox_id="sb-aa1"))] == ["sb-aa1"]
    assert len(db.events(EventQuery(sandbox_id="sb-aa"))) == 6  # a prefix
    assert db.events(EventQuery(sandbox_id="sb-a%")) == []  # LIKE wildcards are literal
    assert len(db.events(EventQuery(types=("write_file",)))) == 5
    assert len(db.events(EventQuery(since=now - 25, until=now - 9))) == 2
    pages: list[list[int]] = []
    after = 0
    while page := db.events(EventQuery(after=after, limit=3)):
        pages.append([r["id"] for r in page])
        after = page[-1]["id"]
    assert [len(p) for p in pages] == [3, 3, 1]
    flat = [i for p in pages for i in p]
    assert flat == sorted(flat) and len(set(flat)) == 7


def test_usage_counts_only_the_part_of_each_sandbox_inside_the_window(db: Database) -> None:
    t0 = 1_000_000.0
    db.apply(
        [
            start("sb-1", "a", t0, memory=2 * GIB, cpus=2.0),
            end("sb-1", t0 + 100),
            start("sb-2", "a", t0 + 50, memory=GIB, cpus=0.5),
            end("sb-2", t0 + 250),
            start("sb-3", "b", t0 - 100),
            end("sb-3", t0 + 10),
            event("b", "", "admission.rejected", t0 + 60),
            event("c", "", "admission.rejected", t0 + 500),
        ]
    )
    usage = {u.tenant: u for u in db.usage(t0, t0 + 200)}
    assert set(usage) == {"a", "b"}
    a = usage["a"]
    assert a.creates == 2
    assert a.sandbox_seconds == pytest.approx(100 + 150)
    assert a.cpu_seconds == pytest.approx(100 * 2 + 150 * 0.5)
    assert a.memory_gib_seconds == pytest.approx(100 * 2 + 150 * 1)
    b = usage["b"]
    assert b.creates == 0  # it started before the window
    assert b.sandbox_seconds == pytest.approx(10)
    assert b.rejections == 1
    only_b = db.usage(t0, t0 + 200, tenant="b")
    assert [u.tenant for u in only_b] == ["b"]
    with pytest.raises(ConfigurationError, match="until must be after since"):
        db.usage(t0, t0)


def test_an_open_sandbox_counts_to_now(db: Database) -> None:
    now = time.time()
    db.apply([start("sb-open", "a", now - 30, cpus=2.0)])
    (usage,) = db.usage(now - 60)
    assert 30 <= usage.sandbox_seconds <= 40
    assert 60 <= usage.cpu_seconds <= 80


def test_rows_a_crashed_server_left_open_end_at_their_last_event(db: Database) -> None:
    t0 = 2_000_000.0
    db.apply(
        [
            start("sb-1", "a", t0),
            event("a", "sb-1", "exec", t0 + 40),
            start("sb-2", "a", t0),
            start("sb-3", "a", t0),
            end("sb-3", t0 + 5),
        ]
    )
    assert db.close_open("another-server") == 0
    assert db.close_open("srv-1") == 2
    assert db.close_open() == 0
    with db.engine.connect() as conn:
        rows = {
            r.sandbox_id: (r.ended, r.end_reason) for r in conn.execute(sa.text("SELECT * FROM sandboxes"))
        }
    assert rows == {"sb-1": (t0 + 40, "lost"), "sb-2": (t0, "lost"), "sb-3": (t0 + 5, "destroyed")}


def test_retention_deletes_old_events_and_ended_sandboxes_only(db: Database) -> None:
    now = time.time()
    db.apply(
        [
            event(at=now - 100),
            event(at=now - 1),
            start("old", "a", now - 100),
            end("old", now - 90),
            start("old-but-open", "a", now - 100),
            start("new", "a", now - 5),
            end("new", now - 1),
        ]
    )
    assert db.prune(now - 50) == 2
    assert len(db.events(EventQuery())) == 1
    with db.engine.connect() as conn:
        left = {r[0] for r in conn.execute(sa.text("SELECT sandbox_id FROM sandboxes"))}
    assert left == {"old-but-open", "new"}


def test_a_database_that_cannot_be_reached_is_a_runtime_not_available_error(tmp_path: Any) -> None:
    port = _closed_port()
    database = Database(f"postgresql://agentnest:secret-pw@127.0.0.1:{port}/x", connect_timeout=2)
    try:
        with pytest.raises(RuntimeNotAvailableError) as info:
            database.revision()
    finally:
        database.close()
    assert f"127.0.0.1:{port}/x" in str(info.value)
    assert "secret-pw" not in str(info.value)  # the password never reaches a message


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", "empty"),
        ("sqlite://", "SQLite file"),
        ("sqlite:///:memory:", "SQLite file"),
        ("mysql://u@h/db", "not supported"),
        ("postgresql+asyncpg://u@h/db", "not supported"),
        ("postgresql://u@h", "names no database"),
        ("postgresql://u:pw@h:notaport/db", "not a database URL"),
    ],
)
def test_bad_database_urls_are_refused_with_the_fix(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as info:
        parse_url(url)
    assert "pw" not in str(info.value)


def test_urls_are_completed_and_the_default_follows_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    assert parse_url("postgresql://u@h/db").drivername == "postgresql+psycopg"
    assert parse_url(str(tmp_path / "m.db")).database == str(tmp_path / "m.db")
    monkeypatch.delenv("AGENTNEST_DATABASE_URL", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert default_database_url() == f"sqlite:///{tmp_path}/agentnest/manager.db"
    monkeypatch.setenv("AGENTNEST_DATABASE_URL", "postgresql://u@h/db")
    assert default_database_url() == "postgresql://u@h/db"


def test_a_database_migrated_by_a_newer_agentnest_is_refused_not_touched(db: Database) -> None:
    with db.engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = 'f00dfeed9999'"))
    for step in (db.upgrade, db.check):
        with pytest.raises(RuntimeNotAvailableError, match=r"f00dfeed9999, which agentnest .* does not know"):
            step()
    assert db.revision() == "f00dfeed9999"  # nothing was changed


def test_the_migrations_build_exactly_the_tables_the_code_uses(db: Database) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from agentnest.server.db_tables import metadata

    with db.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []


def test_a_silent_server_s_sandboxes_are_ended_and_a_true_end_still_wins(db: Database) -> None:
    now = time.time()
    db.heartbeat("live", host="h1", pid=11, started=now)
    db.heartbeat("dead", host="h2", pid=22, started=now - 300)
    db.heartbeat("live", host="h1", pid=11, started=now)  # a second beat updates, never duplicates
    with db.engine.begin() as conn:
        conn.execute(sa.text("UPDATE servers SET seen = :t WHERE server = 'dead'"), {"t": now - 120})
    rows = []
    for sandbox, server in (("sb-live", "live"), ("sb-dead", "dead"), ("sb-unknown", "nobody")):
        op = start(sandbox, "a", now - 100)
        op[1]["server"] = server
        rows.append(op)
    db.apply([*rows, event("a", "sb-dead", "exec", now - 90)])
    assert [s["server"] for s in db.list_servers()] == ["live", "dead"]

    owners, closed = db.sweep(60)
    assert owners == ["h2:22"] and closed == 2
    assert [s["server"] for s in db.list_servers()] == ["live"]
    with db.engine.connect() as conn:
        found = conn.execute(sa.text("SELECT sandbox_id, ended, end_reason FROM sandboxes"))
        ended = {r.sandbox_id: (r.ended, r.end_reason) for r in found}
    assert ended["sb-live"] == (None, None)
    assert ended["sb-dead"] == (pytest.approx(now - 90), "lost")  # its last event
    assert ended["sb-unknown"] == (pytest.approx(now - 100), "lost")  # its start
    assert db.sweep(60) == ([], 0)
    # The "dead" server was only cut off: its real end replaces the presumed loss.
    db.apply([end("sb-dead", now - 5, "destroyed")])
    db.apply([end("sb-dead", now, "deadline")])  # and a real end is final
    with db.engine.connect() as conn:
        row = conn.execute(
            sa.text("SELECT ended, end_reason FROM sandboxes WHERE sandbox_id = 'sb-dead'")
        ).one()
    assert (row.ended, row.end_reason) == (pytest.approx(now - 5), "destroyed")
    db.deregister("live")
    assert db.list_servers() == []


def test_upgrading_a_database_of_the_first_schema_keeps_its_history(database_url: str) -> None:
    from alembic import command

    database = Database(database_url)
    try:
        with database.engine.begin() as conn:
            command.upgrade(database._alembic(conn), "0001")
        assert database.revision() == "0001"
        with pytest.raises(RuntimeNotAvailableError, match="serve db upgrade"):
            database.check()
        database.apply([event("a", "sb-1", "exec", 1000.0), start("sb-1", "a", 999.0)])
        assert database.upgrade() == ("0001", database.head())
        database.check()
        (kept,) = database.events(EventQuery())
        assert (kept["sandbox_id"], kept["time"]) == ("sb-1", 1000.0)
        assert database.usage(900.0, 1100.0)[0].sandbox_seconds == pytest.approx(101.0)
        assert database.list_servers() == []
    finally:
        database.close()


def test_a_gone_server_s_owner_label_is_not_reclaimed_while_a_live_server_carries_it(db: Database) -> None:
    now = time.time()
    db.heartbeat("old", host="pod-1", pid=1, started=now - 500)
    db.heartbeat("new", host="pod-1", pid=1, started=now)  # restarted in the same container
    with db.engine.begin() as conn:
        conn.execute(sa.text("UPDATE servers SET seen = :t WHERE server = 'old'"), {"t": now - 120})
    assert db.sweep(60) == ([], 0)
    assert [s["server"] for s in db.list_servers()] == ["new"]


def test_a_connection_returned_after_close_is_closed_not_left_to_the_collector(database_url: str) -> None:
    """A query still running in a worker thread when the server closed its database (a ping
    abandoned at shutdown) returns its connection to the disposed pool afterwards: it is closed
    there, not left open until the garbage collector warns (ResourceWarning, an error here)."""
    import gc
    import sys

    import sqlalchemy as sa

    from agentnest.server.db import Database

    database = Database(database_url)
    conn = database.engine.connect()
    raw = conn.connection.dbapi_connection
    conn.execute(sa.text("SELECT 1"))
    database.close()
    conn.close()  # back to the pool that close() disposed
    caught: list[BaseException | None] = []
    hook, sys.unraisablehook = sys.unraisablehook, lambda u: caught.append(u.exc_value)
    try:
        del conn, database
        gc.collect()
    finally:
        sys.unraisablehook = hook
    assert caught == []
    closed = getattr(raw, "closed", None)
    assert closed in (True, 1) or raw is None or _sqlite_closed(raw)


def _sqlite_closed(raw: object) -> bool:
    import sqlite3

    try:
        raw.execute("SELECT 1")  # type: ignore[attr-defined]
    except sqlite3.ProgrammingError:
        return True
    return False
