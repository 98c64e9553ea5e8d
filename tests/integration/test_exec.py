"""Running commands: results, I/O, bounded output, streaming and non-destructive timeouts."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator

import pytest

from agentnest import (
    ConfigurationError,
    ExecutionChunk,
    ExecutionError,
    ExecutionTimeoutError,
    FileAccessError,
    Sandbox,
    SecurityPolicy,
)

from .helpers import Background, processes

MiB = 1024 * 1024


@pytest.fixture
def workdir(shared_sandbox: Sandbox) -> Iterator[str]:
    """A fresh directory in the shared sandbox's workspace."""
    name = f"exec-{os.urandom(4).hex()}"
    shared_sandbox.mkdir(name)
    yield name
    shared_sandbox.remove_file(name, recursive=True)


# -- results -----------------------------------------------------------------------------


def test_exec_runs_argv_without_a_shell(shared_sandbox: Sandbox) -> None:
    result = shared_sandbox.exec(["printf", "%s|", "a b", "$HOME", "*"])
    assert result.stdout == "a b|$HOME|*|"
    assert result.ok and result.exit_code == 0 and result.stderr == ""
    assert result.duration >= 0 and not result.timed_out and not result.truncated


def test_exec_shell_exit_code_and_stderr(shared_sandbox: Sandbox) -> None:
    result = shared_sandbox.exec_shell("echo out; echo err >&2; exit 42")
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 42)
    assert not result.ok
    assert result.output == "out\nerr\n"
    with pytest.raises(ExecutionError) as info:
        result.check()
    assert info.value.result is result
    assert "42" in str(info.value)


def test_signal_exit_is_reported(shared_sandbox: Sandbox) -> None:
    result = shared_sandbox.exec_shell("kill -TERM $$")
    assert (result.exit_code, result.signal) == (143, 15)


def test_missing_program_is_exit_127(shared_sandbox: Sandbox) -> None:
    result = shared_sandbox.exec(["agentnest-no-such-program"])
    assert result.exit_code == 127
    assert "agentnest-no-such-program" in result.stderr


def test_exec_python_run_code_and_exec_json(shared_sandbox: Sandbox) -> None:
    assert shared_sandbox.exec_python("import sys; print(sys.version_info[0])").stdout == "3\n"
    assert shared_sandbox.run_code("a = 10; print(a * 2)").output == "20\n"
    assert shared_sandbox.run_code("echo hi; echo there >&2", "shell").output == "hi\nthere\n"
    assert shared_sandbox.exec_json("import json; print(json.dumps({'a': [1, 2]}))") == {"a": [1, 2]}
    with pytest.raises(ConfigurationError):
        shared_sandbox.run_code("1", "cobol")


def test_env_is_per_call(shared_sandbox: Sandbox) -> None:
    script = 'printf "%s|%s" "${AN_TEST_A-unset}" "$HOME"'
    assert shared_sandbox.exec_shell(script, env={"AN_TEST_A": "one two"}).stdout == "one two|/tmp"
    assert shared_sandbox.exec_shell(script).stdout == "unset|/tmp"


def test_sandbox_environment_reaches_every_command(backend_name: str) -> None:
    with Sandbox(backend=backend_name, timeout=60, environment={"GREETING": "hello"}) as sb:
        assert sb.exec_shell('echo "$GREETING"').stdout == "hello\n"
        assert sb.exec_shell('echo "$GREETING"', env={"GREETING": "override"}).stdout == "override\n"
        assert sb.exec_python("import os; print(os.environ['GREETING'])").stdout == "hello\n"


def test_cwd_defaults_to_workspace_and_is_per_call(shared_sandbox: Sandbox, workdir: str) -> None:
    assert shared_sandbox.exec(["pwd"]).stdout == "/workspace\n"
    assert shared_sandbox.exec(["pwd"], cwd=workdir).stdout == f"/workspace/{workdir}\n"
    assert shared_sandbox.exec(["pwd"], cwd=f"/workspace/{workdir}").stdout == f"/workspace/{workdir}\n"
    assert shared_sandbox.exec(["pwd"]).stdout == "/workspace\n"
    missing = shared_sandbox.exec(["pwd"], cwd=f"{workdir}/missing")
    assert missing.exit_code != 0 and "does not exist" in missing.stderr
    with pytest.raises(FileAccessError):
        shared_sandbox.exec(["pwd"], cwd="/etc")


def test_stdin(shared_sandbox: Sandbox) -> None:
    assert shared_sandbox.exec(["cat"], input="héllo\nwörld\n").stdout == "héllo\nwörld\n"
    data = os.urandom(3 * MiB)
    digest = "import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())"
    assert shared_sandbox.exec_python(digest, input=data).stdout.strip() == hashlib.sha256(data).hexdigest()
    # Without input, stdin is empty: a reader does not wait forever.
    assert shared_sandbox.exec(["cat"], timeout=10).stdout == ""


def test_unicode_output(shared_sandbox: Sandbox) -> None:
    text = "héllo wörld ✓ 日本語 🐍"
    result = shared_sandbox.exec_python(f"import sys; print({text!r}); print({text!r}, file=sys.stderr)")
    assert result.stdout == text + "\n"
    assert result.stderr == text + "\n"


def test_invalid_utf8_output_is_replaced(shared_sandbox: Sandbox) -> None:
    code = "import sys; sys.stdout.buffer.write(b'ok \\xff\\xfe end'); sys.stderr.buffer.write(b'\\xc3')"
    result = shared_sandbox.exec_python(code)
    assert result.ok
    assert result.stdout == "ok \ufffd\ufffd end"
    assert result.stderr == "\ufffd"


# -- output size -------------------------------------------------------------------------


def test_output_is_bounded(backend_name: str) -> None:
    policy = SecurityPolicy(max_output_bytes=100_000)
    with Sandbox(backend=backend_name, timeout=60, security_policy=policy) as sb:
        code = "import sys\nfor _ in range(80): sys.stdout.write('x' * 65536)\nsys.stderr.write('e' * 65536)"
        result = sb.exec_python(code, timeout=60)
        assert result.truncated
        assert result.exit_code == 0  # the producer was drained, not killed
        assert len(result.stdout.encode()) + len(result.stderr.encode()) <= 100_000
        assert set(result.stdout) == {"x"}
        assert sb.exec_shell("echo alive").stdout == "alive\n"


def test_large_output_within_the_limit_arrives_intact(backend_name: str) -> None:
    policy = SecurityPolicy(max_output_bytes=32 * MiB)
    with Sandbox(backend=backend_name, timeout=60, security_policy=policy) as sb:
        code = (
            "import hashlib, sys\nh = hashlib.sha256()\n"
            "for i in range(20):\n"
            "    block = bytes([65 + i]) * (1024 * 1024)\n"
            "    h.update(block)\n"
            "    sys.stdout.buffer.write(block)\n"
            "sys.stdout.flush()\nsys.stderr.write(h.hexdigest())\n"
        )
        result = sb.exec_python(code, timeout=60)
        assert not result.truncated
        assert len(result.stdout) == 20 * MiB
        assert hashlib.sha256(result.stdout.encode()).hexdigest() == result.stderr


# -- streaming -----------------------------------------------------------------------------


def test_stream_shell_yields_chunks_as_they_come(shared_sandbox: Sandbox, workdir: str) -> None:
    # The command cannot finish before the test reacts to its first chunk, so
    # receiving that chunk proves the output was streamed, not buffered.
    script = f"echo first; echo warn >&2; while [ ! -e {workdir}/go ]; do sleep 0.05; done; echo second"
    stream = shared_sandbox.stream_shell(script, timeout=30)
    chunks: list[ExecutionChunk] = []
    for chunk in stream:
        chunks.append(chunk)
        if chunk.data == "first\n":
            assert stream.result is None
            shared_sandbox.write_file(f"{workdir}/go", "")
    assert "".join(c.data for c in chunks if c.stream == "stdout") == "first\nsecond\n"
    assert "".join(c.data for c in chunks if c.stream == "stderr") == "warn\n"
    assert stream.result is not None
    assert stream.result.ok
    assert stream.result.stdout == "first\nsecond\n"
    assert stream.result.stderr == "warn\n"


def test_leaving_a_stream_early_kills_the_command(shared_sandbox: Sandbox) -> None:
    stream = shared_sandbox.stream_shell("echo first; exec sleep 86")
    for chunk in stream:
        assert chunk.data == "first\n"
        break  # dropping the iterator closes it, which cancels the command
    deadline = time.monotonic() + 10
    while ["sleep", "86"] in processes(shared_sandbox):
        assert time.monotonic() < deadline, "the abandoned command is still running"
        time.sleep(0.1)


# -- timeouts --------------------------------------------------------------------------------

STRAY = (["sleep", "100"], ["sleep", "200"], ["sleep", "50"])


def test_timeout_kills_the_whole_tree_and_spares_the_sandbox(sandbox: Sandbox) -> None:
    sandbox.write_file("before.txt", "written before")
    script = (
        "echo data > by-command.txt; "
        "sleep 100 & (setsid sh -c 'trap \"\" TERM; sleep 200' &) ; echo started; sleep 50"
    )
    start = time.monotonic()
    with pytest.raises(ExecutionTimeoutError) as info:
        sandbox.exec_shell(script, timeout=1)
    elapsed = time.monotonic() - start
    assert isinstance(info.value, TimeoutError)
    result = info.value.result
    assert result is not None
    assert result.timed_out and not result.ok
    assert result.stdout == "started\n"
    assert elapsed < 6, f"the timeout took {elapsed:.1f}s"
    # Nothing of the tree survives, not even the setsid'd process that ignores SIGTERM.
    left = [argv for argv in processes(sandbox) if argv in STRAY or "trap" in " ".join(argv)]
    assert left == []
    # The sandbox, its files and the next command are fine.
    assert sandbox.read_file("before.txt") == "written before"
    assert sandbox.read_file("by-command.txt") == "data\n"
    assert sandbox.exec_shell("echo next").stdout == "next\n"


def test_timeout_spares_a_concurrent_command(sandbox: Sandbox) -> None:
    long = Background(lambda: sandbox.exec_shell("sleep 3; echo survived", timeout=60))
    deadline = time.monotonic() + 10
    while ["sleep", "3"] not in processes(sandbox):
        assert time.monotonic() < deadline, "the long command did not start"
        time.sleep(0.05)
    with pytest.raises(ExecutionTimeoutError):
        sandbox.exec_shell("sleep 30", timeout=0.5)
    assert long.join(30)
    assert long.error is None
    assert long.result.stdout == "survived\n"
    assert long.result.ok


def test_orphans_are_reaped(shared_sandbox: Sandbox) -> None:
    """Processes whose parents exit are reaped: no zombies pile up toward the pids limit."""
    for _ in range(5):
        shared_sandbox.exec_shell("(sleep 0.1 &) ; (sh -c 'sleep 0.1' &) ; true").check()
    code = r"""
import json, os
zombies = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            with open("/proc/%s/stat" % pid) as f:
                raw = f.read()
        except OSError:
            continue
        if raw[raw.rfind(")") + 2:].split()[0] == "Z":
            zombies.append(raw)
print(json.dumps(zombies))
"""
    deadline = time.monotonic() + 10
    while True:
        orphans = [argv for argv in processes(shared_sandbox) if argv[:2] == ["sleep", "0.1"]]
        zombies = json.loads(shared_sandbox.exec_python(code).stdout)
        if not orphans and not zombies:
            break
        assert time.monotonic() < deadline, f"orphans {orphans} zombies {zombies}"
        time.sleep(0.2)
