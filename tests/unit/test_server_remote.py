"""The remote backend and the streaming endpoint over real HTTP on loopback, local agents behind
the server (no engine): the whole Sandbox API through the agent channel, channel ownership, and a
client that disconnects mid-stream having its command killed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
from server_fakes import IMAGE, LocalBackend, add_token, auth, killed_on_exit, make_settings, tagged

from agentnest import ChannelError, ConfigurationError, Sandbox, SandboxConfig, SandboxDestroyedError
from agentnest._core import core_of
from agentnest.runtime.remote import RemoteBackend
from agentnest.server.app import ServerSettings, create_app
from agentnest.server.thread import serve_in_thread
from agentnest.testing.wait import wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ServerSettings, LocalBackend]]:
    root = tmp_path_factory.mktemp("remote")
    backend = LocalBackend(root / "sandboxes")
    backend.root.mkdir()
    settings = make_settings(root, backend)
    try:
        with serve_in_thread(create_app(settings)) as url:
            yield url, settings, backend
        assert backend.live_agents() == 0  # shutdown destroyed everything
    finally:
        backend.kill_all()


@pytest.fixture
def tag() -> Iterator[str]:
    with killed_on_exit(uuid.uuid4().hex) as value:
        yield value


def test_sandbox_api_through_the_remote_backend(server: tuple[str, ServerSettings, LocalBackend]) -> None:
    url, settings, _ = server
    remote = RemoteBackend(url, add_token(settings, f"r-{uuid.uuid4().hex[:6]}"))
    try:
        with Sandbox(IMAGE, timeout=60, backend=remote) as sb:
            assert sb.exec_shell("echo hi; exit 2").exit_code == 2
            sb.write_file("a/b.txt", "text")
            assert sb.read_file("a/b.txt") == "text"
            assert "".join(c.data for c in sb.stream_shell("echo 1; echo 2")) == "1\n2\n"
            session = sb.python_session()
            session.run("x = 20")
            assert session.run("x * 2 + 2").result == "42"
            new_deadline = sb.extend(30)
            assert abs(new_deadline - sb.deadline) < 1e-6
            assert remote.is_running(sb.handle)
        assert not remote.is_running(sb.handle)
        assert remote.exit_reason(sb.handle) is not None
        with pytest.raises(SandboxDestroyedError):
            sb.exec_shell("true")
    finally:
        remote.close()


def test_channel_is_only_for_the_owner(server: tuple[str, ServerSettings, LocalBackend]) -> None:
    url, settings, _ = server
    owner = RemoteBackend(url, add_token(settings, f"o-{uuid.uuid4().hex[:6]}"))
    other = RemoteBackend(url, add_token(settings, f"x-{uuid.uuid4().hex[:6]}"))
    try:
        with Sandbox(IMAGE, timeout=60, backend=owner) as sb:
            with pytest.raises(ChannelError, match="refused"):
                other.open_channel(sb.handle)
            assert not other.is_running(sb.handle)
            other.destroy(sb.handle)  # idempotent and harmless: not its sandbox
            assert sb.exec_shell("echo still here").stdout == "still here\n"
    finally:
        owner.close()
        other.close()


def test_remote_backend_configuration_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTNEST_REMOTE_URL", raising=False)
    monkeypatch.delenv("AGENTNEST_REMOTE_TOKEN", raising=False)
    with pytest.raises(ConfigurationError, match="AGENTNEST_REMOTE_URL"):
        RemoteBackend()
    with pytest.raises(ConfigurationError, match="token"):
        RemoteBackend("http://127.0.0.1:1")
    with pytest.raises(ConfigurationError, match="plain http"):
        RemoteBackend("http://192.0.2.1:8700", "t")
    with pytest.raises(ConfigurationError, match="http://HOST"):
        RemoteBackend("ftp://x", "t")
    backend = RemoteBackend("http://192.0.2.1:8700", "t", allow_insecure=True)
    # A preset is refused before any request (192.0.2.1 is never contacted).
    with pytest.raises(ConfigurationError, match="preset='browser'"):
        backend.create(SandboxConfig(image="local/browser", preset="browser"))
    backend.close()


def test_unreachable_and_refused(server: tuple[str, ServerSettings, LocalBackend]) -> None:
    from agentnest import RuntimeNotAvailableError

    url, _, _ = server
    gone = RemoteBackend("http://127.0.0.1:9", "t")
    bad = RemoteBackend(url, "ant_aaaaaaaaaaaa_" + "A" * 43)
    try:
        with pytest.raises(RuntimeNotAvailableError, match="cannot reach"):
            gone.capabilities()
        with pytest.raises(ConfigurationError, match="refused the token"):
            bad.capabilities()
    finally:
        gone.close()
        bad.close()


def test_disconnecting_mid_stream_kills_the_command(
    server: tuple[str, ServerSettings, LocalBackend], tag: str
) -> None:
    url, settings, _ = server
    headers = auth(add_token(settings, f"s-{uuid.uuid4().hex[:6]}"))
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        sid = client.post("/v1/sandboxes", json={}).json()["id"]
        body = {"shell": "sleep 60 & sleep 60 & echo started; wait; echo never", "env": {"AN_TAG": tag}}
        with client.stream("POST", f"/v1/sandboxes/{sid}/exec/stream", json=body) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = response.iter_lines()
            assert next(lines) == "event: stdout"
            assert next(lines) == 'data: {"data": "started\\n"}'
            # A child caught between fork and exec shows no environment for a moment.
            wait_until(lambda: len(tagged(tag)) == 3, "sh and both sleeps to run")
        # The client went away: the server noticed and killed the whole tree.
        wait_until(lambda: tagged(tag) == [], "the command's process tree to die")
        events = client.post(f"/v1/sandboxes/{sid}/exec/stream", json={"shell": "echo a; exit 4"}).text
        assert (
            events.endswith('"signal": null}\n\n') and "event: exit" in events and '"exit_code": 4' in events
        )


def test_closing_the_agent_channel_kills_its_commands(
    server: tuple[str, ServerSettings, LocalBackend], tag: str
) -> None:
    url, settings, _ = server
    remote = RemoteBackend(url, add_token(settings, f"c-{uuid.uuid4().hex[:6]}"))
    try:
        with Sandbox(IMAGE, timeout=60, backend=remote) as sb:
            stream = sb.stream_shell("sleep 60 & echo go; wait", env={"AN_TAG": tag})
            chunks = iter(stream)
            assert next(chunks).data == "go\n"
            wait_until(lambda: len(tagged(tag)) == 2, "sh and the sleep to run")
            # The client process "crashes": its websocket closes without a word.
            channel = core_of(sb).channel
            assert channel is not None
            channel.close("client gone")
            wait_until(lambda: tagged(tag) == [], "the agent to kill its commands")
            assert sb.exec_shell("echo new agent").stdout == "new agent\n"
    finally:
        remote.close()
