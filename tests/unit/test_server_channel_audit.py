"""The server's audit of the raw agent channel: the frame scanner and event mapping (pure
logic, bytes cut at every boundary), then over real HTTP on loopback with local agents behind
the server: what a ``remote`` client runs and touches shows up in the *server's* audit log,
environment values never do, and bytes that are not the agent protocol close the channel
without reaching the agent."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from server_fakes import IMAGE, LocalBackend, add_token, make_settings

from agentnest import MemoryObserver, Sandbox, Secret
from agentnest.agent import wire
from agentnest.events import EventType
from agentnest.runtime import launch
from agentnest.runtime.remote import RemoteBackend
from agentnest.server.app import ServerSettings, create_app
from agentnest.server.channel_audit import MAX_CODE_BYTES, MAX_PENDING, ChannelAudit, FrameScanner
from agentnest.server.thread import serve_in_thread

pytestmark = pytest.mark.timeout(60)

Recorded = list[tuple[EventType, dict[str, Any], str]]


def recorder() -> tuple[Recorded, Any]:
    seen: Recorded = []

    def emit(kind: EventType, data: Mapping[str, Any], actor: str) -> None:
        seen.append((kind, dict(data), actor))

    return seen, emit


def feed_in_pieces(feed: Any, data: bytes, size: int) -> list[Any]:
    out: list[Any] = []
    for i in range(0, len(data), size):
        result = feed(data[i : i + size])
        if result:
            out.extend(result)
    return out


# -- the scanner -------------------------------------------------------------------------------


CLIENT = b"".join(
    (
        b"5\nABCDE",  # a (tiny) bundle
        wire.encode({"t": "exec", "id": 1, "argv": ["echo", "hi"], "env": {"K": "env-value-77"}}),
        wire.encode({"t": "write", "id": 2, "path": "a.txt", "first": True, "last": True}, b"x" * 300),
        wire.encode({"t": "session.run", "id": 3, "session": 1}, b"print('code')"),
        wire.encode({"t": "ping", "id": 4}),
    )
)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 1 << 20])
def test_scanner_finds_every_header_at_every_cut(size: int) -> None:
    scanner = FrameScanner(bundle=True, capture={"session.run": 5})
    frames = feed_in_pieces(scanner.feed, CLIENT, size)
    assert [(h["t"], blen, body) for h, blen, body in frames] == [
        ("exec", 0, b""),
        ("write", 300, b""),  # bodies of kinds not captured are skipped, not kept
        ("session.run", 13, b"print"),  # the first capture bytes only
        ("ping", 0, b""),
    ]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"GET / HTTP/1.1\r\n", "bundle length"),
        (b"\n", "empty"),
        (b"9999999999\n", "bundle length"),
        (b"%d\n" % (17 * 1024 * 1024), "exceeds"),
        (b"0\n" + b"\x00\x00\x00\x00\x00\x00\x00\x00", "out of bounds"),
        (b"0\n" + b"\x00\x01\x00\x01\x00\x00\x00\x00", "out of bounds"),
        (b"0\n" + b"\x00\x00\x00\x02\x7f\x00\x00\x00", "exceeds the limit"),
        (b"0\n" + b"\x00\x00\x00\x02\x00\x00\x00\x00[]", "not a JSON object"),
        (b"0\n" + b'\x00\x00\x00\x04\x00\x00\x00\x00{"t"', "not valid UTF-8 JSON"),
        (b"0\n" + wire.encode({"x": 1}), "no string 't'"),
    ],
)
def test_scanner_refuses_what_is_not_the_protocol(data: bytes, message: str) -> None:
    scanner = FrameScanner(bundle=True)
    with pytest.raises(wire.WireError, match=message):
        scanner.feed(data + b"\x00" * 16)
    with pytest.raises(wire.WireError):  # and stays failed
        scanner.feed(wire.encode({"t": "ping"}))


# -- events from frames ------------------------------------------------------------------------


def agent_frames() -> bytes:
    return b"".join(
        (
            wire.encode({"t": "hello", "version": 1}),
            wire.encode({"t": "out", "id": 1, "fd": 1}, b"hi\n" * 1000),
            wire.encode(
                {"t": "exit", "id": 1, "code": 0, "signal": None, "timed_out": False, "duration": 0.5}
            ),
            wire.encode({"t": "done", "id": 2, "size": 300}),
            wire.encode({"t": "ran", "id": 3, "timed_out": False, "duration": 0.25}),
        )
    )


@pytest.mark.parametrize("size", [1, 5, 1 << 20])
def test_requests_and_answers_become_events(size: int) -> None:
    seen, emit = recorder()
    audit = ChannelAudit(emit, "tok123")
    feed_in_pieces(audit.from_client, CLIENT, size)
    feed_in_pieces(audit.from_agent, agent_frames(), size)
    kinds = [kind for kind, _, _ in seen]
    assert kinds == [
        EventType.EXEC_STARTED,
        EventType.EXEC_FINISHED,
        EventType.FILE_WRITTEN,
        EventType.SESSION_RAN,
    ]
    assert {actor for _, _, actor in seen} == {"remote"}
    assert all(data["token"] == "tok123" and data["via"] == "channel" for _, data, _ in seen)
    started, finished, written, ran = (data for _, data, _ in seen)
    assert started["argv"] == ["echo", "hi"] and started["env"] == ["K"]
    assert "env-value-77" not in repr(seen)  # environment values are never recorded
    assert finished["exit_code"] == 0 and finished["argv"] == ["echo", "hi"] and finished["duration"] == 0.5
    assert written == {"path": "a.txt", "size": 300, "token": "tok123", "via": "channel"}
    assert ran["code"] == "print('code')" and ran["duration"] == 0.25
    audit.close()
    assert len(seen) == 4  # nothing was left pending


def test_timeouts_refusals_and_a_closed_channel() -> None:
    seen, emit = recorder()
    audit = ChannelAudit(emit, "t")
    audit.from_client(b"0\n")
    for rid, argv in ((1, ["sleep", "9"]), (2, ["nope"]), (3, ["sleep", "60"])):
        audit.from_client(wire.encode({"t": "exec", "id": rid, "argv": argv}))
    audit.from_client(wire.encode({"t": "remove", "id": 4, "path": "gone.txt"}))
    audit.from_client(wire.encode({"t": "read", "id": 5, "path": "secret.txt"}))
    audit.from_agent(wire.encode({"t": "exit", "id": 1, "code": None, "signal": 9, "timed_out": True}))
    audit.from_agent(wire.encode({"t": "error", "id": 2, "code": "spawn", "message": "no such file: nope"}))
    audit.from_agent(wire.encode({"t": "done", "id": 4}))
    audit.from_agent(wire.encode({"t": "error", "id": 5, "code": "denied", "message": "no"}))
    audit.close()  # id 3 never answered: the agent kills it when the stream closes
    got = [
        (kind, data.get("argv") or data.get("path"))
        for kind, data, _ in seen
        if kind != EventType.EXEC_STARTED
    ]
    assert got == [
        (EventType.EXEC_TIMED_OUT, ["sleep", "9"]),
        (EventType.EXEC_FINISHED, ["nope"]),
        (EventType.FILE_REMOVED, "gone.txt"),
        (EventType.EXEC_FINISHED, ["sleep", "60"]),
    ]
    assert seen[4][1]["error"] == "no such file: nope"
    assert seen[-1][1]["cancelled"] is True and seen[-1][1]["reason"] == "the channel closed"


def test_pending_requests_are_bounded_and_garbage_from_the_agent_only_stops_the_audit() -> None:
    seen, emit = recorder()
    audit = ChannelAudit(emit, "t")
    audit.from_client(b"0\n")
    for rid in range(MAX_PENDING + 10):
        audit.from_client(wire.encode({"t": "read", "id": rid, "path": f"f{rid}"}))
    audit.from_agent(wire.encode({"t": "done", "id": 0, "size": 1}))  # forgotten: the oldest went first
    audit.from_agent(wire.encode({"t": "done", "id": MAX_PENDING + 9, "size": 1}))
    assert [data["path"] for _, data, _ in seen] == [f"f{MAX_PENDING + 9}"]
    audit.from_agent(b"\x00\x00\x00\x00garbage")
    audit.from_agent(wire.encode({"t": "done", "id": MAX_PENDING + 8, "size": 1}))
    assert len(seen) == 1  # the client's decoder reports a broken agent; the audit just stops


def test_session_code_is_cut_where_the_local_event_cuts_it() -> None:
    seen, emit = recorder()
    audit = ChannelAudit(emit, "t")
    code = "x = 1\n" * 1000
    audit.from_client(b"0\n" + wire.encode({"t": "session.run", "id": 7, "session": 2}, code.encode()))
    audit.from_agent(wire.encode({"t": "ran", "id": 7, "lost": True, "reason": "killed"}))
    ((kind, data, _),) = seen
    assert kind == EventType.SESSION_LOST
    assert data["code"] == code[:MAX_CODE_BYTES] and data["session"] == 2


# -- over HTTP, agents behind the server -------------------------------------------------------


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ServerSettings, MemoryObserver]]:
    root = tmp_path_factory.mktemp("audited")
    backend = LocalBackend(root / "sandboxes")
    backend.root.mkdir()
    events = MemoryObserver()
    settings = make_settings(root, backend, observers=(events,))
    try:
        with serve_in_thread(create_app(settings)) as url:
            yield url, settings, events
    finally:
        backend.kill_all()


class Client:
    """A new token of the audited server and a remote backend with it."""

    def __init__(self, audited: tuple[str, ServerSettings, MemoryObserver]) -> None:
        self.url, settings, self.events = audited
        self.secret = add_token(settings, f"c-{uuid.uuid4().hex[:6]}")
        self.token_id = self.secret.split("_")[1]
        self.remote = RemoteBackend(self.url, self.secret)


@pytest.fixture
def client(audited: tuple[str, ServerSettings, MemoryObserver]) -> Iterator[Client]:
    made = Client(audited)
    yield made
    made.remote.close()


def test_the_server_records_what_a_remote_client_does(client: Client) -> None:
    key = "k-" + uuid.uuid4().hex
    with Sandbox(IMAGE, timeout=60, backend=client.remote, environment={"API_KEY": Secret(key)}) as sb:
        sid = sb.id
        sb.exec_shell("echo audited; exit 3", env={"PLAIN": "value-" + "9" * 12})
        sb.write_file("notes/a.txt", "x" * 5000)
        assert sb.read_file("notes/a.txt") == "x" * 5000
        sb.remove_file("notes/a.txt")
        assert sb.python_session().run("6 * 7").result == "42"
        # A secret given at creation is known to the server's guard too: in argv it is redacted.
        sb.exec(["true", key])
    events = client.events
    mine = [e for e in events.events if e.sandbox_id == sid and e.actor == "remote"]
    kinds = [e.type for e in mine]
    for kind in (
        EventType.EXEC_STARTED,
        EventType.EXEC_FINISHED,
        EventType.FILE_WRITTEN,
        EventType.FILE_READ,
        EventType.FILE_REMOVED,
        EventType.SESSION_RAN,
    ):
        assert kind in kinds, kinds
    assert all(e.data["token"] == client.token_id for e in mine)
    shell = next(
        e for e in mine if e.type == EventType.EXEC_STARTED and "echo audited" in " ".join(e.data["argv"])
    )
    assert "PLAIN" in shell.data["env"]
    finished = [e for e in mine if e.type == EventType.EXEC_FINISHED and e.data.get("exit_code") == 3]
    assert len(finished) == 1
    written = next(e for e in mine if e.type == EventType.FILE_WRITTEN)
    assert written.data["path"] == "notes/a.txt" and written.data["size"] == 5000
    assert next(e for e in mine if e.type == EventType.SESSION_RAN).data["code"] == "6 * 7"
    dump = repr([e.to_dict() for e in events.events])
    assert "value-999999999999" not in dump  # environment values are never recorded
    assert key not in dump
    assert any(e.data["argv"] == ["true", "[REDACTED]"] for e in mine if e.type == EventType.EXEC_STARTED)


def test_garbage_on_the_channel_closes_it_before_the_agent_sees_it(client: Client) -> None:
    from websockets.sync.client import connect

    url, secret = client.url, client.secret
    with Sandbox(IMAGE, timeout=60, backend=client.remote) as sb:
        target = url.replace("http://", "ws://") + f"/v1/sandboxes/{sb.id}/channel"
        with connect(target, additional_headers={"Authorization": f"Bearer {secret}"}) as ws:
            ws.send(launch.bundle() + b"\x00\x00\x00\x05\x00\x00\x00\x00{bad}")
            with pytest.raises(Exception) as closed:  # websockets' close classes vary by version
                while True:
                    ws.recv(timeout=10)
            assert getattr(closed.value, "rcvd", None) is not None, closed.value
            assert closed.value.rcvd.code == 1007  # type: ignore[attr-defined]
            assert "not the agent protocol" in closed.value.rcvd.reason  # type: ignore[attr-defined]
        # The sandbox and its own channel are untouched.
        assert sb.exec_shell("echo fine").stdout == "fine\n"


def test_a_rename_through_the_channel_is_audited_with_both_paths() -> None:
    seen, emit = recorder()
    audit = ChannelAudit(emit, "t")
    audit.from_client(b"0\n")
    audit.from_client(wire.encode({"t": "move", "id": 1, "path": "a.txt", "to": "b/c.txt"}))
    audit.from_client(wire.encode({"t": "move", "id": 2, "path": "x", "to": "y"}))
    audit.from_agent(wire.encode({"t": "done", "id": 1}))
    audit.from_agent(wire.encode({"t": "error", "id": 2, "code": "not_found", "message": "no x"}))
    moved = [(kind, data["path"], data["to"]) for kind, data, _ in seen]
    assert moved == [(EventType.FILE_MOVED, "a.txt", "b/c.txt")]  # only what happened
