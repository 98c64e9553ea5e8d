"""Named Python sessions and the session list, against the real agent without an engine.

The registry of names lives in the in-sandbox agent, so these tests check it
from the host side in three ways: through ``Sandbox`` on the local backend
(the agent is a plain child over a socketpair), through a *new* host channel
to the same agent (a relay in front of one agent, as after an agent-side
reconnect: the host starts from nothing and must find the sessions), and
with a hand-played agent (``Peer``) that sends hostile replies.
"""

from __future__ import annotations

import dataclasses
import math
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from doubles.local_agent import LocalAgent, LocalBackend

from agentnest import (
    ConfigurationError,
    MemoryObserver,
    PythonSession,
    PythonSessionInfo,
    Sandbox,
    SessionLostError,
    UnsupportedCapabilityError,
)
from agentnest._core import core_of
from agentnest.agent import sessions as agent_sessions
from agentnest.agent import wire
from agentnest.agent.limits import MAX_SESSIONS, NAME_MAX, valid_key, valid_name
from agentnest.channel.client import Channel
from agentnest.channel.protocol import ProtocolViolation, RawSessionRun, RawValue, parse_session_list
from agentnest.channel.streams import ByteStream, SocketStream
from agentnest.errors import ChannelError
from agentnest.runtime import launch
from agentnest.runtime.base import SandboxHandle
from agentnest.session import check_name
from agentnest.testing.peer import Peer
from agentnest.testing.wait import wait_until

pytestmark = pytest.mark.timeout(60)

#: How long any single wait in these tests may take before it counts as a hang.
WAIT = 15.0


# -- names and replies: pure -----------------------------------------------------------

GOOD_NAMES = ["main", "a", "A_1", "worker-2", "data.v2", "x" * NAME_MAX, "0"]
BAD_NAMES: list[Any] = [
    "",
    " ",
    "a b",
    "-x",
    ".x",
    "x" * (NAME_MAX + 1),
    "ä",
    "a/b",
    "main\n",
    "\x00",
    5,
    b"main",
]


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_good_names(name: str) -> None:
    assert valid_name(name)
    assert check_name(name) == name


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_bad_names_are_refused_with_the_fix(name: Any) -> None:
    assert not valid_name(name)
    with pytest.raises(ConfigurationError, match=r"invalid: use 1 to 64 letters.*name=\"main\""):
        check_name(name)


def test_keys() -> None:
    assert valid_key("0123456789ab") and valid_key("f" * 32)
    for key in ["", "ABC", "g", "f" * 33, 12, None]:
        assert not valid_key(key), key


def entry(**changes: Any) -> dict[str, Any]:
    e: dict[str, Any] = {
        "session": 3,
        "pid": 77,
        "python": "3.11.2",
        "name": "main",
        "key": "0123456789ab",
        "started": 1.7e9,
        "state": "idle",
    }
    e.update(changes)
    return e


def test_parse_session_list() -> None:
    listed = parse_session_list(
        {"t": "done", "sessions": [entry(), entry(session=4, name=None, key="ab", state="running")]}
    )
    assert [(i.session, i.name, i.key, i.busy) for i in listed] == [
        (3, "main", "0123456789ab", False),
        (4, None, "ab", True),
    ]
    assert listed[0].started == 1.7e9 and listed[0].pid == 77
    assert parse_session_list({"t": "done", "sessions": []}) == ()


@pytest.mark.parametrize(
    "reply",
    [
        {"t": "error", "sessions": []},
        {"t": "done"},
        {"t": "done", "sessions": {}},
        {"t": "done", "sessions": [entry(session=i + 1, name=None) for i in range(MAX_SESSIONS + 1)]},
        {"t": "done", "sessions": ["main"]},
        {"t": "done", "sessions": [entry(name="a b")]},
        {"t": "done", "sessions": [entry(name=7)]},
        {"t": "done", "sessions": [entry(key="")]},
        {"t": "done", "sessions": [entry(key="NOT-HEX")]},
        {"t": "done", "sessions": [entry(started=math.nan)]},
        {"t": "done", "sessions": [entry(started=math.inf)]},
        {"t": "done", "sessions": [entry(started=-1)]},
        {"t": "done", "sessions": [entry(started=True)]},
        {"t": "done", "sessions": [entry(state="dead")]},
        {"t": "done", "sessions": [entry(session=0)]},
        {"t": "done", "sessions": [entry(pid="1")]},
        {"t": "done", "sessions": [entry(python="x" * 41)]},
        {"t": "done", "sessions": [entry(), entry(name="other")]},  # the same session twice
        {"t": "done", "sessions": [entry(), entry(session=4)]},  # the same name twice
    ],
    ids=lambda r: str(r)[:60],
)
def test_parse_session_list_refuses_what_does_not_check(reply: dict[str, Any]) -> None:
    with pytest.raises(ProtocolViolation):
        parse_session_list(reply)


# -- through Sandbox, on the local backend ----------------------------------------------


@pytest.fixture
def events() -> MemoryObserver:
    return MemoryObserver()


@pytest.fixture
def sandbox(tmp_path: Path, events: MemoryObserver) -> Iterator[Sandbox]:
    sb = Sandbox("local", timeout=120, backend=LocalBackend(tmp_path), observers=[events])
    try:
        yield sb
    finally:
        sb.destroy()


def names(sb: Sandbox) -> list[str | None]:
    return [i.name for i in sb.sessions()]


def test_the_same_name_is_the_same_session(sandbox: Sandbox) -> None:
    first = sandbox.python_session(name="main")
    first.run("x = 41")
    again = sandbox.python_session(name="main")
    assert again is first  # one object: one lock, one run at a time
    assert again.run("x + 1").result == "42"
    assert first.name == "main" and "'main'" in repr(first)
    listed = sandbox.sessions()
    assert listed == (PythonSessionInfo("main", first.id, first.pid or 0, listed[0].started, False),)
    assert time.time() - WAIT < listed[0].started <= time.time()


def test_anonymous_sessions_are_distinct(sandbox: Sandbox) -> None:
    a, b = sandbox.python_session(), sandbox.python_session()
    named = sandbox.python_session(name="main")
    a.run("z = 1")
    assert b.run("z").error is not None and named.run("z").error is not None
    assert a.name is None and len({a.id, b.id, named.id}) == 3 and len({a.pid, b.pid, named.pid}) == 3
    assert sorted(map(str, names(sandbox))) == ["None", "None", "main"]
    assert {i.id for i in sandbox.sessions()} == {a.id, b.id, named.id}


def test_sessions_drops_what_was_closed_and_the_name_is_free_again(sandbox: Sandbox) -> None:
    first = sandbox.python_session(name="work")
    first.run("v = 1")
    other = sandbox.python_session()
    assert names(sandbox) == ["work", None]
    first.close()
    assert names(sandbox) == [None]
    second = sandbox.python_session(name="work")
    assert second is not first and second.id != first.id
    assert second.run("'v' in globals()").result == "False"  # a new interpreter
    assert names(sandbox) == [None, "work"]
    other.close()
    second.close()
    assert sandbox.sessions() == ()


def test_an_ended_interpreter_is_started_again_under_its_name(sandbox: Sandbox) -> None:
    session = sandbox.python_session(name="main")
    session.run("x = 1")
    pid = session.pid
    with pytest.raises(SessionLostError):
        session.run("import os; os._exit(3)")
    assert sandbox.sessions() == ()  # the agent lists only live ones
    again = sandbox.python_session(name="main")
    assert again is session and again.id == session.id
    assert session.run("'x' in globals()").result == "False"
    assert session.pid != pid
    assert [(i.name, i.id) for i in sandbox.sessions()] == [("main", session.id)]


def test_reset_keeps_the_name_and_id(sandbox: Sandbox) -> None:
    session = sandbox.python_session(name="main")
    session.run("x = 1")
    session.reset()
    assert session.run("'x' in globals()").result == "False"
    assert [(i.name, i.id, i.pid) for i in sandbox.sessions()] == [("main", session.id, session.pid)]
    assert sandbox.python_session(name="main") is session


def test_busy_is_listed_while_code_runs(sandbox: Sandbox, tmp_path: Path) -> None:
    session = sandbox.python_session(name="main")
    code = "import os, time\nprint('go', flush=True)\nwhile not os.path.exists('done'):\n    time.sleep(0.01)"
    stream = session.stream(code, timeout=30)
    chunks = iter(stream)
    assert next(chunks).data == "go\n"
    assert [i.busy for i in sandbox.sessions()] == [True]
    sandbox.write_file("done", "")
    assert list(chunks) == []
    assert [i.busy for i in sandbox.sessions()] == [False]


def test_a_bad_name_is_refused_before_anything_starts(sandbox: Sandbox) -> None:
    bad: list[Any] = ["", "a b", "x" * 65, 3]
    for name in bad:
        with pytest.raises(ConfigurationError, match="session name"):
            sandbox.python_session(name=name)
    assert sandbox.sessions() == ()


def test_concurrent_opens_of_one_name_share_one_interpreter(sandbox: Sandbox) -> None:
    barrier = threading.Barrier(4)
    got: list[PythonSession] = []
    lock = threading.Lock()

    def open_it() -> None:
        barrier.wait(WAIT)
        s = sandbox.python_session(name="shared")
        with lock:
            got.append(s)

    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert len(got) == 4 and all(s is got[0] for s in got)
    assert names(sandbox) == ["shared"]


def test_opened_events_say_name_and_whether_it_attached(sandbox: Sandbox, events: MemoryObserver) -> None:
    session = sandbox.python_session(name="main")
    sandbox.python_session()
    opened = [e.data for e in events.events if e.type.value == "session.opened"]
    assert opened[0]["name"] == "main" and opened[0]["attached"] is False
    assert opened[0]["session"] == session.id
    assert "name" not in opened[1]  # anonymous: as before


def test_after_an_agent_restart_the_name_starts_afresh(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path)
    with Sandbox("local", timeout=120, backend=backend) as sb:
        old = sb.python_session(name="main")
        old.run("x = 1")
        backend.agents[sb.id][-1].kill()
        with pytest.raises(SessionLostError, match="agent"):
            old.run("x")
        new = sb.python_session(name="main")  # the new agent has no "main": a new one
        assert new is not old and new.id != old.id
        assert new.run("'x' in globals()").result == "False"
        with pytest.raises(SessionLostError, match=r"opened again.*python_session\(name='main'\)"):
            old.reset()
        new.close()
        old.reset()  # the name is free again: the old object takes it
        assert [(i.name, i.id) for i in sb.sessions()] == [("main", old.id)]


def test_an_agent_without_names_is_refused_clearly(tmp_path: Path) -> None:
    with Sandbox("local", timeout=120, backend=LocalBackend(tmp_path)) as sb:
        ch = core_of(sb).link()
        assert ch.hello is not None
        ch.hello = dataclasses.replace(ch.hello, capabilities=frozenset({"session"}))
        with pytest.raises(UnsupportedCapabilityError, match="named Python sessions"):
            sb.python_session(name="main")
        with pytest.raises(UnsupportedCapabilityError, match="session list"):
            sb.sessions()
        assert sb.python_session().run("1 + 1").result == "2"  # anonymous ones still work


# -- a new channel to the same agent ---------------------------------------------------


class Relay:
    """One real agent; host channels come and go in front of it.

    As after an agent-side reconnect (or a live fork): the agent and its
    interpreters live on, a host connects a fresh channel, and the agent
    greets it (the relay replays the agent's hello and swallows the bundle a
    host sends first, which this agent already has).
    """

    def __init__(self, workspace: str) -> None:
        self.agent = LocalAgent(workspace)
        self.connections = 0
        self._bundle = len(launch.bundle())
        self._hello: bytes | None = None
        self._greeted = threading.Event()
        self._host: socket.socket | None = None
        self._lock = threading.Lock()
        threading.Thread(target=self._from_agent, daemon=True).start()

    def connect(self) -> ByteStream:
        ours, theirs = socket.socketpair()
        again = self.connections > 0
        if again:
            assert self._greeted.wait(WAIT) and self._hello is not None
        with self._lock:  # frames to a host go out whole, one at a time
            self.connections += 1
            self._host = ours
            if again and self._hello is not None:
                ours.sendall(self._hello)
        threading.Thread(target=self._to_agent, args=(ours, again), daemon=True).start()
        return SocketStream(theirs)

    def drop(self) -> None:
        """Cut the current host channel; the agent does not notice."""
        with self._lock:
            host, self._host = self._host, None
        if host is not None:
            host.shutdown(socket.SHUT_RDWR)
            host.close()

    def close(self) -> None:
        self.drop()
        self.agent.kill()

    def _to_agent(self, sock: socket.socket, skip_bundle: bool) -> None:
        skip = self._bundle if skip_bundle else 0
        try:
            while data := sock.recv(1 << 20):
                cut = min(skip, len(data))
                skip -= cut
                if data[cut:]:
                    self.agent.stream.write(data[cut:])
        except OSError:
            pass  # this host went away; the agent stays

    def _from_agent(self) -> None:
        decoder = wire.Decoder(max_body_bytes=64 * 1024 * 1024)
        try:
            while data := self.agent.stream.read(1 << 20):
                decoder.feed(data)
                for header, body in decoder.frames():
                    frame = wire.encode(header, body)
                    if header.get("t") == "hello" and self._hello is None:
                        self._hello = frame
                        self._greeted.set()
                    with self._lock:
                        if self._host is not None:
                            try:
                                self._host.sendall(frame)
                            except OSError:
                                pass  # the host went away: the frame is lost, as on a cut channel
        except OSError:
            pass


class RelayBackend(LocalBackend):
    """The local backend, with every channel of a sandbox going to one long-lived agent."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.relays: dict[str, Relay] = {}

    def open_channel(self, handle: SandboxHandle) -> ByteStream:
        relay = self.relays.get(handle.id)
        if relay is None:
            relay = self.relays[handle.id] = Relay(handle.info["workspace"])
        return relay.connect()

    def destroy(self, handle: SandboxHandle) -> None:
        relay = self.relays.pop(handle.id, None)
        if relay is not None:
            relay.close()
        super().destroy(handle)


def run(ch: Channel, session: int, code: str) -> tuple[str | None, RawSessionRun]:
    handle = ch.start_session_run(session, code.encode(), timeout=10, max_output=1 << 20)
    result: str | None = None
    deadline = time.monotonic() + WAIT
    while True:
        event = handle.next_event(deadline)
        if isinstance(event, RawValue) and event.name == "result":
            result = event.text
        if isinstance(event, RawSessionRun):
            return result, event


def test_a_fresh_channel_lists_and_attaches_by_name(tmp_path: Path) -> None:
    relay = Relay(str(tmp_path))
    try:
        deadline = time.monotonic() + WAIT
        first = Channel.connect(relay.connect(), launch.bundle())
        opened = first.open_session(deadline, name="main", key="0123456789ab")
        assert not opened.attached and opened.name == "main" and opened.key == "0123456789ab"
        anonymous = first.open_session(deadline, key="abcdef")
        assert run(first, opened.session, "x = 41")[1].lost is False
        relay.drop()
        wait_until(lambda: not first.alive, "the first channel to break")

        # A new host channel, with nothing on the host side: the agent knows.
        second = Channel.connect(relay.connect(), launch.bundle())
        assert second.hello is not None and "session-names" in second.hello.capabilities
        listed = {i.name: i for i in second.list_sessions(deadline)}
        assert set(listed) == {"main", None}
        assert (listed["main"].session, listed["main"].pid, listed["main"].key) == (
            opened.session,
            opened.pid,
            "0123456789ab",
        )
        assert listed[None].key == "abcdef" and listed[None].session == anonymous.session
        again = second.open_session(deadline, name="main", key="ffffffffffff")
        assert again.attached and again.session == opened.session and again.key == "0123456789ab"
        assert run(second, again.session, "x + 1")[0] == "42"
        # Ids are the agent's own: the new channel's request ids start at 1 again
        # and a new session collides with none of the old ones.
        other = second.open_session(deadline, name="other")
        assert other.session not in (opened.session, anonymous.session) and not other.attached
        second.close()
    finally:
        relay.close()


def test_a_sandbox_whose_channel_was_replaced_keeps_its_sessions(tmp_path: Path) -> None:
    backend = RelayBackend(tmp_path)
    events = MemoryObserver()
    with Sandbox("local", timeout=120, backend=backend, observers=[events]) as sb:
        main = sb.python_session(name="main")
        main.run("x = 41")
        anon = sb.python_session()
        anon.run("y = 1")
        pids = (main.pid, anon.pid)
        old = core_of(sb).channel
        backend.relays[sb.id].drop()
        wait_until(lambda: old is not None and not old.alive, "the channel to break")

        listed = sb.sessions()  # a new channel to the same agent
        assert backend.relays[sb.id].connections == 2
        assert {(i.name, i.id, i.pid) for i in listed} == {
            ("main", main.id, pids[0]),
            (None, anon.id, pids[1]),
        }
        assert "agent.restarted" in [e.type.value for e in events.events]
        assert sb.python_session(name="main") is main
        assert main.run("x + 1").result == "42"
        assert anon.run("y + 1").result == "2"  # an anonymous one carries on too
        assert (main.pid, anon.pid) == pids
        anon.close()
        assert names(sb) == ["main"]


def test_a_session_busy_with_the_old_channels_run_is_not_taken_over(tmp_path: Path) -> None:
    backend = RelayBackend(tmp_path)
    with Sandbox("local", timeout=120, backend=backend) as sb:
        main = sb.python_session(name="main")
        main.run("x = 1")
        stream = main.stream("import time\nprint('go', flush=True)\ntime.sleep(60)", timeout=60)
        chunks = iter(stream)
        assert next(chunks).data == "go\n"
        backend.relays[sb.id].drop()
        with pytest.raises((SessionLostError, ChannelError)):
            list(chunks)
        assert [i.busy for i in sb.sessions()] == [True]
        with pytest.raises(SessionLostError):
            main.run("1")  # this object lost its run with the old channel
        assert sb.python_session(name="main") is main  # the agent still has it
        with pytest.raises(ConfigurationError, match="still running code sent before"):
            main.run("2")
        main.interrupt()  # reaches the run the old channel sent
        wait_until(lambda: [i.busy for i in sb.sessions()] == [False], "the old run to stop")
        assert main.run("x").result == "1"  # state intact: nothing was lost but a channel


# -- a hand-played agent: the host checks what comes back -------------------------------


@pytest.fixture
def peer() -> Iterator[tuple[Peer, Channel]]:
    p = Peer()
    result: list[Channel] = []
    t = threading.Thread(target=lambda: result.append(Channel.connect(p.stream, None, timeout=WAIT)))
    t.start()
    p.hello(caps=["session", "session-names"])
    t.join(WAIT)
    try:
        yield p, result[0]
    finally:
        result[0].close()
        p.close()


def ask(peer: Peer, call: Any, reply: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """Make ``call()`` in a thread, answer its request with ``reply``; the request and the outcome."""
    out: list[Any] = []

    def go() -> None:
        try:
            out.append(call())
        except Exception as exc:
            out.append(exc)

    t = threading.Thread(target=go)
    t.start()
    request, _ = peer.receive()
    peer.send({**reply, "id": request["id"]})
    t.join(WAIT)
    return request, out[0]


def test_peer_open_by_name_sends_name_key_and_fresh(peer: tuple[Peer, Channel]) -> None:
    p, ch = peer
    request, info = ask(
        p,
        lambda: ch.open_session(time.monotonic() + WAIT, name="main", key="abc", fresh=True),
        {"t": "done", **entry(name="main", state="idle"), "attached": True},
    )
    assert request == {"t": "session.open", "id": request["id"], "name": "main", "key": "abc", "fresh": True}
    assert info.attached and info.name == "main"


@pytest.mark.parametrize(
    "reply",
    [
        {"t": "done", **entry(name="other")},  # not the name asked for
        {"t": "done", **entry(name=None)},
        {"t": "done", **entry(name="main", key="XYZ")},
        {"t": "done", **entry(name="main", started="now")},
    ],
    ids=lambda r: str(r)[:60],
)
def test_peer_open_by_name_violations_close_the_channel(
    peer: tuple[Peer, Channel], reply: dict[str, Any]
) -> None:
    p, ch = peer
    _, outcome = ask(p, lambda: ch.open_session(time.monotonic() + WAIT, name="main"), reply)
    assert isinstance(outcome, ChannelError) and "protocol" in str(outcome)
    assert not ch.alive


def test_peer_hostile_session_list_closes_the_channel(peer: tuple[Peer, Channel]) -> None:
    p, ch = peer
    huge = [entry(session=i + 1, name=None) for i in range(MAX_SESSIONS + 1)]
    request, outcome = ask(
        p, lambda: ch.list_sessions(time.monotonic() + WAIT), {"t": "done", "sessions": huge}
    )
    assert request["t"] == "session.list"
    assert isinstance(outcome, ChannelError) and not ch.alive


def test_peer_session_list(peer: tuple[Peer, Channel]) -> None:
    p, ch = peer
    _, outcome = ask(
        p, lambda: ch.list_sessions(time.monotonic() + WAIT), {"t": "done", "sessions": [entry()]}
    )
    assert [(i.name, i.key) for i in outcome] == [("main", "0123456789ab")]
    assert ch.alive


def test_agent_refuses_an_invalid_name_itself() -> None:
    sent: list[dict[str, Any]] = []
    sessions = agent_sessions.Sessions(
        lambda h, body=b"": sent.append(h),
        selectors.DefaultSelector(),
        lambda pid, marker: 0,
        {},
        "/",
        "token",
    )
    bad: list[dict[str, Any]] = [{"name": "a b"}, {"name": 3}, {"key": "NOPE"}, {"name": "x" * 65}]
    for fields in bad:
        sessions.handle("session.open", {"t": "session.open", "id": 1, **fields}, b"")
    assert [h["code"] for h in sent] == ["invalid"] * 4
    sessions.handle("session.list", {"t": "session.list", "id": 2}, b"")
    assert sent[-1] == {"t": "done", "id": 2, "sessions": []}
