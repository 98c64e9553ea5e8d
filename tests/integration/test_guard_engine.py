"""The guard on a real engine (runc and runsc): every denial leaves no trace, every
secret path is redacted, and a scripted scenario leaves exactly the expected events.

A denial test proves the operation did not happen: it looks at the sandbox (or the
engine, or the host) afterwards with the gate open, not only at the exception.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentnest import (
    ExecutionError,
    FileAccessError,
    JsonLogObserver,
    MemoryObserver,
    PolicyDeniedError,
    Sandbox,
    Secret,
    SecurityPolicy,
)
from agentnest.approvals import ApprovalRequest, RuleApprover
from agentnest.profiles import load_profiles
from agentnest.secrets import REDACTED

from .helpers import owned_containers

SECRET = "sk-test-Zx81_q9/Lm+T"
FILE_SECRET = "file-only-7c1d2e3f4a5b"


class Gate:
    """An approval hook whose refusals the test switches on and off."""

    def __init__(self) -> None:
        self.denied: set[str] = set()
        self.asked: list[ApprovalRequest] = []
        self._lock = threading.Lock()

    def __call__(self, request: ApprovalRequest) -> bool:
        with self._lock:
            self.asked.append(request)
            return request.kind not in self.denied

    def deny(self, *kinds: str) -> Gate:
        self.denied = set(kinds)
        return self

    def kinds(self) -> list[str]:
        return [r.kind for r in self.asked]


@pytest.fixture(scope="module")
def gated(backend_name: str) -> Iterator[tuple[Sandbox, Gate, MemoryObserver]]:
    gate = Gate()
    obs = MemoryObserver()
    with Sandbox(
        backend=backend_name,
        timeout=900,
        approval_hook=gate,
        observers=[obs],
        environment={"TOKEN": Secret(SECRET), "KEY": Secret(FILE_SECRET, as_file=True)},
    ) as sb:
        yield sb, gate, obs


@pytest.fixture
def gate(gated: tuple[Sandbox, Gate, MemoryObserver]) -> Iterator[Gate]:
    gated[1].deny()
    yield gated[1]
    gated[1].deny()


def denied(gate: Gate, kind: str) -> Any:
    gate.deny(kind)
    return pytest.raises(PolicyDeniedError, match=re.escape(f"{kind} denied"))


# -- every denial path leaves no trace ----------------------------------------------------


def test_denied_exec_does_not_run(gated: tuple[Sandbox, Gate, MemoryObserver], gate: Gate) -> None:
    sb, _, obs = gated
    before = len(obs.events)
    with denied(gate, "exec"):
        sb.exec_shell("echo ran > /workspace/exec-marker")
    with denied(gate, "exec"):
        list(sb.stream_shell("echo ran > /workspace/stream-marker"))
    gate.deny()
    assert not sb.exists("exec-marker") and not sb.exists("stream-marker")
    types = [e.type.value for e in obs.events[before:]]
    assert "exec.started" not in types[: types.index("policy.denied")]
    assert gate.asked[-1].kind == "file.list"


def test_denied_write_and_mkdir_create_nothing(sb_gate: tuple[Sandbox, Gate]) -> None:
    sb, gate = sb_gate
    with denied(gate, "file.write"):
        sb.write_file("w.txt", "data")
    with denied(gate, "file.write"):
        sb.mkdir("newdir")
    gate.deny()
    assert not sb.exists("w.txt") and not sb.exists("newdir")


def test_denied_read_returns_nothing_and_records_no_read(
    gated: tuple[Sandbox, Gate, MemoryObserver], gate: Gate
) -> None:
    sb, _, obs = gated
    sb.write_file("r.txt", "content")
    before = len(obs.events)
    with denied(gate, "file.read"):
        sb.read_file("r.txt")
    with denied(gate, "file.read"):
        sb.download("r.txt", "/nonexistent-never-created")
    assert "file.read" not in [e.type.value for e in obs.events[before:]]
    assert not Path("/nonexistent-never-created").exists()


def test_denied_remove_keeps_the_file(sb_gate: tuple[Sandbox, Gate]) -> None:
    sb, gate = sb_gate
    sb.write_file("keep.txt", "still here")
    with denied(gate, "file.remove"):
        sb.remove_file("keep.txt")
    gate.deny()
    assert sb.read_file("keep.txt") == "still here"


def test_denied_listing(sb_gate: tuple[Sandbox, Gate]) -> None:
    sb, gate = sb_gate
    with denied(gate, "file.list"):
        sb.list_files(".")
    with denied(gate, "file.list"):
        sb.exists("anything")
    with denied(gate, "file.list"):
        sb.artifacts()


def test_denied_session_run_does_not_execute(sb_gate: tuple[Sandbox, Gate]) -> None:
    sb, gate = sb_gate
    with sb.python_session() as session:
        with denied(gate, "session.run"):
            session.run("x = 41")
        gate.deny()
        assert session.run("'x' in globals()").result == "False"


def test_denied_snapshot_writes_nothing_on_the_host(sb_gate: tuple[Sandbox, Gate], tmp_path: Path) -> None:
    sb, gate = sb_gate
    target = tmp_path / "snap.tar"
    with denied(gate, "snapshot"):
        sb.snapshot(target)
    assert list(tmp_path.iterdir()) == []


def test_denied_restore_leaves_the_workspace(sb_gate: tuple[Sandbox, Gate], tmp_path: Path) -> None:
    sb, gate = sb_gate
    sb.write_file("state.txt", "before")
    snap = tmp_path / "snap.tar"
    sb.snapshot(snap)
    sb.write_file("state.txt", "after")
    with denied(gate, "restore"):
        sb.restore(snap)
    gate.deny()
    assert sb.read_file("state.txt") == "after"


def test_denied_fork_creates_no_container(sb_gate: tuple[Sandbox, Gate], docker_client: Any) -> None:
    sb, gate = sb_gate
    before = owned_containers(docker_client)
    with denied(gate, "fork"):
        sb.fork()
    assert owned_containers(docker_client) == before


def test_refused_creation_creates_no_container(backend_name: str, docker_client: Any) -> None:
    before = owned_containers(docker_client)
    for policy in (
        SecurityPolicy(max_memory="256m"),
        SecurityPolicy(allowed_images=("only/this:*",)),
        SecurityPolicy(required_runtime="kata"),
    ):
        with pytest.raises(PolicyDeniedError, match=r"sandbox\.create denied"):
            Sandbox(backend=backend_name, security_policy=policy, memory="512m")
    if backend_name == "docker":  # open networking exists on runc only
        with pytest.raises(PolicyDeniedError, match="network denied"):
            Sandbox(backend=backend_name, network_enabled=True, approval_hook=lambda r: r.kind != "network")
    assert owned_containers(docker_client) == before


def test_required_runtime_is_enforced_against_the_real_backend(backend_name: str) -> None:
    runtime = {"docker": "runc", "gvisor": "runsc"}[backend_name]
    other = {"docker": "runsc", "gvisor": "runc"}[backend_name]
    with pytest.raises(PolicyDeniedError, match=f"requires OCI runtime '{other}'"):
        Sandbox(backend=backend_name, security_policy=SecurityPolicy(required_runtime=other))
    with Sandbox(backend=backend_name, security_policy=SecurityPolicy(required_runtime=runtime)) as sb:
        assert sb.exec_shell("echo ok").stdout == "ok\n"


def test_rules_from_a_profile_gate_a_real_sandbox(backend_name: str, tmp_path: Path) -> None:
    path = tmp_path / "agentnest.yaml"
    path.write_text(
        "profiles:\n"
        "  locked:\n"
        "    max_memory: 1g\n"
        "    approvals:\n"
        "      - {kind: exec, match: 'python3 *', action: allow}\n"
        "      - {kind: file.write, match: '/workspace/out/*', action: allow}\n"
        "      - {kind: file.list, match: '*', action: allow}\n"
    )
    profile = load_profiles(path).get("locked")
    assert isinstance(profile.security_policy.approval_hook, RuleApprover)
    with Sandbox(backend=backend_name, profile=profile) as sb:
        assert sb.exec(["python3", "-c", "print(1)"]).stdout == "1\n"
        with pytest.raises(PolicyDeniedError):
            sb.exec_shell("touch /workspace/out/shell-made")
        sb.write_file("out/ok.txt", "yes")
        with pytest.raises(PolicyDeniedError):
            sb.write_file("elsewhere.txt", "no")
        assert sb.exists("out/ok.txt") and not sb.exists("out/shell-made") and not sb.exists("elsewhere.txt")


@pytest.fixture
def sb_gate(gated: tuple[Sandbox, Gate, MemoryObserver], gate: Gate) -> tuple[Sandbox, Gate]:
    return gated[0], gate


# -- every redaction path -------------------------------------------------------------------


def test_secret_is_redacted_from_exec_output_both_streams(sb_gate: tuple[Sandbox, Gate]) -> None:
    sb, _ = sb_gate
    result = sb.exec_shell('echo "out $TOKEN"; echo "err $TOKEN" >&2')
    assert result.stdout == f"out {REDACTED}\n"
    assert result.stderr == f"err {REDACTED}\n"


def test_secret_split_across_stream_chunks_is_redacted(sb_gate: tuple[Sandbox, Gate]) -> None:
    sb, _ = sb_gate
    # The two halves are written (and flushed) separately, with a pause, so
    # they reach the host as separate chunks.
    code = (
        "import os, sys, time\n"
        "t = os.environ['TOKEN']\n"
        "sys.stdout.write('A' + t[:7]); sys.stdout.flush(); time.sleep(0.3)\n"
        "sys.stdout.write(t[7:] + 'B'); sys.stdout.flush()\n"
    )
    chunks = [c.data for c in sb.stream_python(code) if c.stream == "stdout"]
    assert len(chunks) >= 2, chunks
    assert "".join(chunks) == f"A{REDACTED}B"
    assert all(SECRET[:7] not in c for c in chunks)


def test_secret_in_encoded_forms_is_redacted(sb_gate: tuple[Sandbox, Gate]) -> None:
    sb, _ = sb_gate
    code = (
        "import base64, os, urllib.parse\n"
        "t = os.environ['TOKEN']\n"
        "print(base64.b64encode(t.encode()).decode())\n"
        "print('Basic ' + base64.b64encode(('user:' + t).encode()).decode())\n"
        "print(urllib.parse.quote(t, safe=''))\n"
        "print(t.encode().hex())\n"
    )
    lines = sb.exec_python(code).stdout.splitlines()
    assert lines[0] == REDACTED
    assert lines[1].startswith("Basic ") and REDACTED in lines[1]
    assert lines[2] == REDACTED
    assert lines[3] == REDACTED


def test_secret_is_redacted_from_session_results_and_exceptions(sb_gate: tuple[Sandbox, Gate]) -> None:
    sb, _ = sb_gate
    with sb.python_session() as session:
        value = session.run("import os; os.environ['TOKEN']")
        assert value.result == repr(REDACTED)
        failed = session.run("raise RuntimeError('leaked ' + os.environ['TOKEN'])")
        assert failed.error is not None and SECRET not in failed.error and REDACTED in failed.error
        with pytest.raises(ExecutionError) as info:
            failed.check()
        assert SECRET not in str(info.value) and REDACTED in str(info.value)


def test_secret_in_an_error_from_the_sandbox_is_redacted(sb_gate: tuple[Sandbox, Gate]) -> None:
    sb, _ = sb_gate
    with pytest.raises(FileAccessError) as info:
        sb.read_file(f"missing-{SECRET}.txt")
    assert SECRET not in str(info.value) and SECRET not in (info.value.path or "")
    with pytest.raises(ExecutionError) as failure:
        sb.exec_shell('echo "boom $TOKEN" >&2; exit 3').check()
    assert SECRET not in str(failure.value) and REDACTED in str(failure.value)


def test_secret_is_redacted_from_file_reads(sb_gate: tuple[Sandbox, Gate]) -> None:
    sb, _ = sb_gate
    sb.exec_shell('echo "token=$TOKEN" > /workspace/dump.txt')
    assert sb.read_file("dump.txt") == f"token={REDACTED}\n"
    # Bytes are returned raw: the caller asked for the exact content.
    assert sb.read_file("dump.txt", encoding=None) == f"token={SECRET}\n".encode()


def test_secret_passed_to_one_command_is_redacted_for_the_rest_of_the_sandbox(
    sb_gate: tuple[Sandbox, Gate],
) -> None:
    sb, _ = sb_gate
    later = "per-call-9f8e7d6c5b"
    sb.exec_shell('echo "$ONCE" > /workspace/once.txt', env={"ONCE": Secret(later)})
    assert sb.exec_shell("cat /workspace/once.txt").stdout == f"{REDACTED}\n"
    assert sb.read_file("once.txt") == f"{REDACTED}\n"


def test_events_and_logs_never_hold_the_secret(gated: tuple[Sandbox, Gate, MemoryObserver]) -> None:
    sb, _, obs = gated
    sb.exec_shell(f"echo {SECRET} > /dev/null")  # the secret in the command line itself
    dumped = json.dumps([e.to_dict() for e in obs.events])
    assert SECRET not in dumped and FILE_SECRET not in dumped
    assert REDACTED in dumped
    assert SECRET not in sb.logs()


def test_file_secret_is_a_private_file_and_not_in_any_environment(sb_gate: tuple[Sandbox, Gate]) -> None:
    sb, _ = sb_gate
    probe = (
        "import hashlib, json, os, stat\n"
        "path = os.environ['KEY_FILE']\n"
        "value = open(path).read()\n"
        "st, dst = os.stat(path), os.stat(os.path.dirname(path))\n"
        "hits = 0\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        "        hits += value.encode() in open('/proc/%s/environ' % pid, 'rb').read()\n"
        "    except OSError:\n"
        "        pass\n"
        "sha = hashlib.sha256(value.encode()).hexdigest()\n"
        "print(json.dumps({'sha': sha, 'mode': oct(st.st_mode & 0o777), 'dir': oct(dst.st_mode & 0o777),\n"
        "    'env': 'KEY' in os.environ, 'hits': hits}))\n"
    )
    found = sb.exec_json(probe)
    assert found == {
        "sha": hashlib.sha256(FILE_SECRET.encode()).hexdigest(),
        "mode": "0o400",
        "dir": "0o700",
        "env": False,
        "hits": 0,
    }
    assert sb.exec_shell('cat "$KEY_FILE"').stdout == REDACTED


def test_scripted_scenario_writes_the_expected_event_sequence(backend_name: str, tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    gate = Gate().deny("file.remove")
    sb = Sandbox(
        backend=backend_name,
        timeout=300,
        observers=[JsonLogObserver(path)],
        approval_hook=gate,
        environment={"TOKEN": Secret(SECRET)},
    )
    try:
        assert sb.exec_shell("echo $TOKEN").stdout == f"{REDACTED}\n"
        sb.write_file("note.txt", base64.b64encode(b"x").decode())
        assert sb.read_file("note.txt") == "eA=="
        with pytest.raises(PolicyDeniedError):
            sb.remove_file("note.txt")
        with sb.python_session() as session:
            session.run("1 + 1")
        with pytest.raises(ExecutionError):
            sb.exec_shell("sleep 30", timeout=0.5)
    finally:
        sb.destroy()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    ask = ["approval.requested", "approval.granted"]
    assert [r["type"] for r in records] == [
        "sandbox.created",
        *ask,
        "exec.started",
        "exec.finished",
        *ask,
        "file.written",
        *ask,
        "file.read",
        "approval.requested",
        "approval.denied",
        "policy.denied",
        "session.opened",
        *ask,
        "session.ran",
        "session.closed",
        *ask,
        "exec.started",
        "exec.timed_out",
        "sandbox.destroyed",
    ]
    assert {r["sandbox_id"] for r in records} == {sb.id}
    assert SECRET not in path.read_text()
    assert records[1]["data"]["command"] == "/bin/sh -c 'echo $TOKEN'"
    denial = next(r for r in records if r["type"] == "policy.denied")
    assert denial["data"]["kind"] == "file.remove" and denial["data"]["path"] == "/workspace/note.txt"


def test_add_secret_redacts_a_value_that_arrived_another_way(sb_gate: tuple[Sandbox, Gate]) -> None:
    sb, _ = sb_gate
    sb.exec_shell("cat > /workspace/token.txt", input="tok-from-stdin-4242")
    assert sb.read_file("token.txt") == "tok-from-stdin-4242"  # not a secret yet
    sb.add_secret(Secret("tok-from-stdin-4242"))
    assert sb.read_file("token.txt") == REDACTED
    assert sb.exec_shell("cat /workspace/token.txt").stdout == REDACTED
    with pytest.raises(ValueError):
        sb.add_secret("")
