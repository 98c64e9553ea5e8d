"""Malformed calls to the host API, and forged traffic on the agent channel.

The public API must refuse bad arguments with the right exception before
anything reaches the sandbox; the agent must refuse malformed requests that
bypass the host's checks; and bytes forged from inside the sandbox must never
harm the host: at worst the channel resets and the next call starts a fresh
agent, with the sandbox and its files intact.
"""

from __future__ import annotations

import errno
import math
from collections.abc import Callable
from typing import Any

import pytest

from agentnest import ChannelError, FileAccessError, MemoryObserver, Sandbox, SandboxDestroyedError
from agentnest._core import core_of
from agentnest.errors import ConfigurationError

from .probes import run_json

pytestmark = pytest.mark.attempt("host_api")


def exec_events(events: MemoryObserver) -> list[str]:
    return [t for t in events.types() if t.startswith("exec.")]


@pytest.fixture(scope="module")
def watched(backend_name: str) -> Any:
    events = MemoryObserver()
    with Sandbox(backend=backend_name, timeout=600, observers=[events]) as sb:
        yield sb, events


BAD_EXEC: dict[str, Callable[[Sandbox], object]] = {
    "argv_is_a_string": lambda sb: sb.exec("rm -rf /"),
    "argv_is_empty": lambda sb: sb.exec([]),
    "argv_item_not_str": lambda sb: sb.exec(["echo", 1]),  # type: ignore[list-item]
    "argv_item_with_nul": lambda sb: sb.exec(["echo", "a\0b"]),
    "argv_item_over_128k": lambda sb: sb.exec(["echo", "x" * (128 * 1024)]),
    "env_name_with_equals": lambda sb: sb.exec(["true"], env={"A=B": "x"}),
    "env_name_reserved": lambda sb: sb.exec(["true"], env={"AGENTNEST_EXEC": "x"}),
    "env_value_with_nul": lambda sb: sb.exec(["true"], env={"A": "x\0y"}),
    "timeout_negative": lambda sb: sb.exec(["true"], timeout=-1),
    "timeout_nan": lambda sb: sb.exec(["true"], timeout=math.nan),
    "timeout_infinite": lambda sb: sb.exec(["true"], timeout=math.inf),
    "timeout_bool": lambda sb: sb.exec(["true"], timeout=True),
    "input_not_bytes": lambda sb: sb.exec(["cat"], input=123),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("call", sorted(BAD_EXEC))
def test_malformed_exec_is_refused_before_running(watched: Any, call: str) -> None:
    sb, events = watched
    before = exec_events(events)
    with pytest.raises(ConfigurationError):
        BAD_EXEC[call](sb)
    # Nothing ran.  (A bad input= is checked after the exec.started event is
    # emitted, so only finished/timed-out events are compared here.)
    ran = [t for t in exec_events(events)[len(before) :] if t != "exec.started"]
    assert ran == [], "a refused call must not run anything"


def test_working_directory_outside_the_workspace_is_refused(watched: Any) -> None:
    sb, events = watched
    before = exec_events(events)
    for cwd in ("/", "/etc", "../", "/workspace/../tmp"):
        with pytest.raises(FileAccessError) as info:
            sb.exec(["pwd"], cwd=cwd)
        assert info.value.code == "outside_workspace", cwd
    assert exec_events(events) == before


BAD_FILES: dict[str, Callable[[Sandbox], object]] = {
    "path_is_bytes": lambda sb: sb.read_file(b"/etc/passwd"),  # type: ignore[call-overload]
    "path_is_none": lambda sb: sb.write_file(None, "x"),  # type: ignore[arg-type]
    "path_is_empty": lambda sb: sb.write_file("", "x"),
    "path_with_nul": lambda sb: sb.write_file("a\0/../../etc/passwd", "x"),
}


@pytest.mark.parametrize("call", sorted(BAD_FILES))
def test_malformed_file_calls_are_refused(watched: Any, call: str) -> None:
    sb, _ = watched
    with pytest.raises(FileAccessError) as info:
        BAD_FILES[call](sb)
    assert info.value.code == "invalid_path"


def test_setuid_mode_and_odd_data_are_refused(watched: Any) -> None:
    sb, _ = watched
    for mode in (0o4755, 0o2755, -1, 0o10000, True):
        with pytest.raises(ConfigurationError):
            sb.write_file("mode.txt", "x", mode=mode)
    with pytest.raises(ConfigurationError):
        sb.write_file("data.txt", 12345)
    assert not sb.exists("mode.txt")
    assert not sb.exists("data.txt")


#: Requests that skip the host's normalisation and go straight to the agent.
RAW_REQUESTS: dict[str, tuple[dict[str, Any], str]] = {
    "read_dotdot": ({"t": "read", "path": "../etc/passwd", "max": 4096}, "outside_workspace"),
    "read_absolute": ({"t": "read", "path": "/etc/passwd", "max": 4096}, "outside_workspace"),
    "stat_proc": ({"t": "stat", "path": "/proc/1/environ"}, "outside_workspace"),
    "list_dotdot": (
        {"t": "list", "path": "a/../..", "recursive": True, "max_entries": 10},
        "outside_workspace",
    ),
    "mkdir_absolute": ({"t": "mkdir", "path": "/tmp/agentnest-escape", "parents": True}, "outside_workspace"),
    "remove_root": ({"t": "remove", "path": "..", "recursive": True}, "outside_workspace"),
    "path_not_a_string": ({"t": "stat", "path": ["etc", "passwd"]}, "invalid_path"),
    "path_with_nul": ({"t": "stat", "path": "a\0b"}, "invalid_path"),
}


@pytest.mark.parametrize("name", sorted(RAW_REQUESTS))
def test_agent_refuses_raw_requests_that_bypass_the_host(watched: Any, name: str) -> None:
    sb, _ = watched
    header, code = RAW_REQUESTS[name]
    with pytest.raises(FileAccessError) as info:
        core_of(sb).request(dict(header))
    assert info.value.code == code
    assert (
        run_json(sb, "import json, os; print(json.dumps(os.path.exists('/tmp/agentnest-escape')))") is False
    )
    assert sb.exec_shell("echo alive").stdout == "alive\n"


def test_agent_survives_unknown_and_ill_typed_requests(watched: Any) -> None:
    sb, _ = watched
    for header in (
        {"t": "no-such-request"},
        {"t": "list", "path": "", "recursive": "yes", "max_entries": -5},
        {"t": "exec", "argv": "rm -rf /", "env": 3},
        {"t": "list", "path": "", "max_entries": "many"},
        {"t": "read", "path": "x", "max": "big"},
    ):
        try:
            core_of(sb).request(dict(header))
        except (FileAccessError, ChannelError):
            pass  # a refusal or a reset: either is fine, the host must carry on
    assert sb.exec_shell("echo alive").stdout == "alive\n"


#: Writes frames into the agent's channel from inside the sandbox: a header
#: length of 4 GiB, then garbage.  runc refuses the open (the agent is not
#: dumpable); gVisor does not honour that, so the bytes reach the host.
FORGE = r"""
import json, os, struct
agent = os.getppid()
try:
    fd = os.open("/proc/%d/fd/1" % agent, os.O_WRONLY)
except OSError as exc:
    print(json.dumps(exc.errno))
    raise SystemExit(0)
os.write(fd, struct.pack(">II", 0xFFFFFFF0, 0xFFFFFFF0) + os.urandom(4096))
print(json.dumps("forged"))
"""


def test_forged_frames_from_inside_do_not_harm_the_host(backend_name: str) -> None:
    events = MemoryObserver()
    with Sandbox(backend=backend_name, timeout=120, observers=[events]) as sb:
        sb.write_file("keep.txt", "kept")
        if backend_name == "docker":
            assert run_json(sb, FORGE, timeout=30) == errno.EACCES
        else:
            # The garbage reaches the host ahead of the probe's own output: the
            # host refuses the 4 GiB header before buffering it and drops the channel.
            with pytest.raises(ChannelError):
                sb.exec(["python3", "-c", FORGE], timeout=30)
        # The next call works (on a fresh agent where the channel was dropped)
        # and the files are intact.
        assert sb.read_file("keep.txt") == "kept"
        assert sb.exec_shell("echo alive").stdout == "alive\n"
        restarted = "agent.restarted" in events.types()
        assert restarted == (backend_name == "gvisor")


#: Writes PID 1's "agent exited" marker to the container's stderr, then keeps
#: the call open: the host must end it (ChannelError) rather than hang.
FORGE_EXIT_MARKER = r"printf '\n\000AGENTNEST-AGENT-EXITED\000\n' > /proc/1/fd/2 && exec sleep 30"


def test_forged_agent_exit_marker_only_restarts_the_agent(backend_name: str) -> None:
    # PID 1 tells the host "the agent exited" with a marker on the container's
    # stderr.  The worst sandbox code can do with it is what killing the agent
    # does: the host starts a new one.
    events = MemoryObserver()
    with Sandbox(backend=backend_name, timeout=120, observers=[events]) as sb:
        sb.write_file("keep.txt", "kept")
        if backend_name == "docker":
            # PID 1 is not dumpable: its descriptors are closed to sandbox code.
            result = sb.exec_shell(FORGE_EXIT_MARKER, timeout=20)
            assert result.exit_code != 0
            assert "Permission denied" in result.stderr
        else:
            with pytest.raises(ChannelError):
                sb.exec_shell(FORGE_EXIT_MARKER, timeout=20)
        assert sb.exec_shell("echo alive").stdout == "alive\n"
        assert sb.read_file("keep.txt") == "kept"
        assert ("agent.restarted" in events.types()) == (backend_name == "gvisor")


def test_calls_on_a_destroyed_sandbox_are_refused(backend_name: str) -> None:
    sb = Sandbox(backend=backend_name, timeout=60)
    sb.destroy()
    for call in (
        lambda: sb.exec(["true"]),
        lambda: sb.write_file("x", "y"),
        lambda: sb.read_file("x"),
        lambda: sb.python_session(),
    ):
        with pytest.raises(SandboxDestroyedError):
            call()
    sb.destroy()  # idempotent


@pytest.fixture
def crowded(watched: Any) -> Any:
    """A directory of 3000 empty files, made by sandbox code, in the shared sandbox."""
    sb, _ = watched
    sb.exec_python(
        "import os\nos.mkdir('many')\nfor i in range(3000): open('many/%d' % i, 'w').close()"
    ).check()
    yield sb
    sb.remove_file("many", recursive=True)


def test_listing_requests_are_bounded(crowded: Sandbox) -> None:
    assert len(crowded.list_files("many", max_entries=100)) == 100
    assert crowded.list_files("many", max_entries=0) == []
    assert crowded.exec_shell("echo alive").stdout == "alive\n"


def test_listing_a_directory_crowded_by_sandbox_code_works(crowded: Sandbox) -> None:
    # Entries travel in frame bodies, a bounded chunk at a time, not in one header.
    assert len(crowded.list_files("many")) == 3000
