"""Every call the released agentnest 0.3.0 accepts is accepted by ours (issue 11).

The real 0.3.0 is installed from the package index into a throwaway venv
(cached beside the sdist, see conftest.py); ``surface.py`` describes its public
surface there and ours here, and ``parity.py`` lists what a 0.3.0 caller
would trip over.  Defaults and return types that changed on purpose are in
``REVIEWED`` with the reason (docs/compat.md says the same to users); a new
change fails until someone reviews it, and a reviewed one that went away
fails too, so the table stays true.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from . import parity
from .conftest import VERSION, _locked, cache_dir

SURFACE = Path(__file__).with_name("surface.py")

#: 0.3.0 callables that took ``*args, **kwargs`` and passed them on.
FORWARDS = {"agentnest.AsyncSandbox.create": "agentnest.Sandbox"}

#: Reviewed differences: ``str(difference)`` -> why it is not a break.
REVIEWED: dict[str, str] = {
    "agentnest.SandboxPool()(max_uses=): default 25 -> 100": (
        "100, with reset='clean' by default: 0.3.0 reused a sandbox 25 times as it was left; every use "
        "now starts clean (docs/compat.md, Defaults)"
    ),
    # -- the same thing, spelled or typed another way
    "agentnest.AsyncSandbox.create ->: returns AsyncSandbox -> _Creation[AsyncSandbox]": (
        "awaiting it gives the AsyncSandbox, as before; it is also an async context manager"
    ),
    "agentnest.AsyncSandbox.stream_shell ->: returns AsyncIterator[ExecutionChunk] -> AsyncExecutionStream": (
        "an async iterator of ExecutionChunk (ending with the 'status' chunk), with .result and aclose()"
    ),
    "agentnest.Sandbox.stream_shell ->: returns Iterator[ExecutionChunk] -> ExecutionStream": (
        "an iterator of ExecutionChunk (ending with the 'status' chunk), with .result and close()"
    ),
    "agentnest.Sandbox.restore ->: returns None -> SnapshotMetadata": "a value where there was None",
    "agentnest.AsyncSandbox.restore ->: returns None -> SnapshotMetadata": "a value where there was None",
    "agentnest.ResourceLimits()(memory=): default '512m' -> 536870912": (
        "512 MiB either way (sizes are parsed)"
    ),
    "agentnest.NetworkPolicy()(mode=): default <NetworkMode.DENY: 'deny'> -> "
    "<NetworkMode.DENIED: 'denied'>": ("the same member: NetworkMode.DENY is NetworkMode.DENIED"),
    "agentnest.git.GitWorkspace()(directory=): default '/workspace/repo' -> None": (
        "None means path='repo', which is /workspace/repo"
    ),
    "agentnest.integrations.langchain.build_langchain_tool(name=): default 'python_sandbox' -> None": (
        "None names the tool 'python_sandbox'"
    ),
    "agentnest.Template()(environment=): default <factory> -> None": "None is an empty environment",
    # -- narrower results that still are what 0.3.0 returned
    "agentnest.git.GitWorkspace.clone ->: returns ExecutionResult -> CloneResult": (
        "an ExecutionResult subclass"
    ),
    "agentnest.git.GitWorkspace.diff ->: returns str -> GitDiff": "a str subclass with the parsed files",
    "agentnest.git.GitWorkspace.status ->: returns str -> GitStatus": (
        "a str subclass with the parsed entries"
    ),
    "agentnest.integrations.langchain.build_langchain_tool ->: returns Any -> StructuredTool": (
        "what it returned"
    ),
    # -- deliberate, documented in docs/compat.md
    "agentnest.EventType.EXECUTION_STARTED: value 'execution.started' -> 'exec.started'": (
        "the member works; the event's string is ours ('exec.started'); "
        "EventType('execution.started') still maps"
    ),
    "agentnest.EventType.EXECUTION_FINISHED: value 'execution.finished' -> 'exec.finished'": (
        "the member works; the event's string is ours; EventType('execution.finished') still maps"
    ),
    "agentnest.NetworkMode.ALLOW: value 'allow' -> 'open'": "alias of OPEN; NetworkMode('allow') still maps",
    "agentnest.NetworkMode.DENY: value 'deny' -> 'denied'": "alias of DENIED; NetworkMode('deny') still maps",
    "agentnest.Sandbox()(runtime=): default 'python:3.12-slim' -> None": (
        "None is AgentNest's base image, built offline (python:3.12-slim cannot be pulled everywhere; "
        "AGENTNEST_IMAGE_ALIASES maps the name to a local image)"
    ),
    "agentnest.integrations.SandboxRunner()(runtime=): default 'python:3.12-slim' -> None": "as Sandbox()",
    "agentnest.Template()(base_image=): default 'python:3.12-slim' -> None": (
        "None is the base image, as Sandbox()"
    ),
    "agentnest.SecurityPolicy()(egress_proxy_image=): default 'python:3.12-slim' -> None": (
        "None runs the proxy in the base image (python:3.12-slim cannot be pulled everywhere)"
    ),
    "agentnest.SecurityPolicy()(max_file_read_bytes=): default 67108864 -> None": (
        "reads are bounded by max_file_bytes (256 MiB) unless this is set; "
        "0.3.0's 64 MiB was its only file bound"
    ),
    "agentnest.integrations.langchain.build_langchain_tool(description=): default 'Execute Python code in a "
    "secure, isolated sandbox and return its output. State persists across calls within a session. Use for "
    "any code the agent should not run on the host.' -> None": (
        "None describes the sandbox the tool really has (limits, network, state), which a model needs"
    ),
}


def venv_030() -> Path:
    """The python of a venv with agentnest 0.3.0 from the package index (made once, cached)."""
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    venv = directory / f"venv-{VERSION}"
    python = venv / "bin" / "python"
    with _locked(directory):
        marker = venv / ".complete"
        if marker.is_file() and python.is_file():
            return python
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=300)
        proc = subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                f"agentnest=={VERSION}",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            pytest.fail(
                f"could not install agentnest {VERSION} into {venv} (pip exited {proc.returncode}):\n"
                f"{(proc.stderr or proc.stdout)[-2000:]}",
                pytrace=False,
            )
        marker.touch()
    return python


def describe(python: str | Path) -> dict[str, Any]:
    # -P-like isolation by hand: run from a temp cwd, so neither checkout nor
    # sdist is on sys.path; only the interpreter's own installed agentnest is.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [str(python), str(SURFACE)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    described: dict[str, Any] = json.loads(proc.stdout)
    return described


@pytest.fixture(scope="module")
def surfaces() -> tuple[dict[str, Any], dict[str, Any]]:
    old = describe(venv_030())
    assert old["agentnest"]["__version__"]["kind"] == "constant"
    new = describe(sys.executable)
    return old, new


def test_the_030_surface_is_the_real_one(surfaces: tuple[dict[str, Any], dict[str, Any]]) -> None:
    """A guard against comparing ours with ours: the venv holds 0.3.0's code."""
    old, new = surfaces
    assert "DENY" in old["agentnest"]["NetworkMode"]["enum"]  # 0.3.0's member name
    assert old["agentnest"]["Sandbox"]["constructor"]["params"][0]["name"] == "runtime"
    assert new["agentnest"]["Sandbox"]["constructor"]["params"][0]["name"] == "image"


def test_no_030_call_breaks(surfaces: tuple[dict[str, Any], dict[str, Any]]) -> None:
    breaks, _ = parity.compare(*surfaces, FORWARDS)
    assert not breaks, "calls 0.3.0 accepts that ours refuses:\n" + "\n".join(map(str, breaks))


#: Reviewed changes matched by pattern: their old value names a registry host,
#: which this repository never spells out.
REVIEWED_PATTERNS: dict[str, str] = {
    r"agentnest\.presets\.browser_sandbox\(image=\): default '[^']+' -> 'agentnest/preset:browser'": (
        "AgentNest's own browser image, built offline on first use (0.3.0's could only be pulled "
        "from a registry, and still needed its own setup); docs/presets.md"
    ),
}


def test_every_changed_default_and_return_type_is_reviewed(
    surfaces: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    _, diffs = parity.compare(*surfaces, FORWARDS)
    by_pattern = [d for d in diffs if any(re.fullmatch(p, str(d)) for p in REVIEWED_PATTERNS)]
    assert len(by_pattern) == len(REVIEWED_PATTERNS), f"REVIEWED_PATTERNS that match nothing: {by_pattern}"
    diffs = [d for d in diffs if d not in by_pattern]
    new = parity.unexplained(diffs, REVIEWED)
    assert not new, "changed defaults/return types nobody reviewed (add to REVIEWED with why):\n" + "\n".join(
        map(str, new)
    )
    stale = sorted(set(REVIEWED) - {str(d) for d in diffs})
    assert not stale, f"REVIEWED entries that no longer differ (remove them): {stale}"


def _without(surface: dict[str, Any], cls: str, member: str | None, param: str) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(surface))
    info = copy["agentnest"][cls]
    sig = info["members"][member]["signature"] if member else info["constructor"]
    sig["params"] = [p for p in sig["params"] if p["name"] != param]
    return copy


@pytest.mark.parametrize(
    ("cls", "member", "param", "expected"),
    [
        ("Sandbox", "exec", "workdir", "agentnest.Sandbox.exec: keyword 'workdir' is gone"),
        (
            "Sandbox",
            None,
            "runtime",
            "agentnest.Sandbox(): positional parameter 0 was 'runtime', now 'image'",
        ),
        ("Sandbox", "write_file", "encoding", "agentnest.Sandbox.write_file: keyword 'encoding' is gone"),
        (
            "SecurityPolicy",
            None,
            "rootless",
            "agentnest.SecurityPolicy(): positional parameter 7 was 'rootless'",
        ),
    ],
)
def test_a_removed_030_parameter_is_caught(
    surfaces: tuple[dict[str, Any], dict[str, Any]], cls: str, member: str | None, param: str, expected: str
) -> None:
    """Take a 0.3.0 parameter out of ours' surface again: the comparison must report it."""
    old, new = surfaces
    breaks, _ = parity.compare(old, _without(new, cls, member, param), FORWARDS)
    assert any(str(b).startswith(expected) for b in breaks), breaks


def _sig(*params: tuple[str, str, bool]) -> dict[str, Any]:
    return {
        "params": [
            {"name": n, "kind": k, "required": r, "default": None if r else "0", "annotation": None}
            for n, k, r in params
        ],
        "returns": None,
    }


P, K = "POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY"


@pytest.mark.parametrize(
    ("old", "new", "found"),
    [
        (_sig(("a", P, True)), _sig(("a", P, True)), []),
        (_sig(("a", P, True)), _sig(("a", P, False)), []),  # optional now: fine
        (_sig(("a", P, False)), _sig(("a", P, True)), ["'a' (was 'a') is now required"]),
        (_sig(("a", P, True)), _sig(("b", P, True), ("a", K, False)), []),  # renamed, old name kept as alias
        (_sig(("a", P, True)), _sig(("b", P, True)), ["positional parameter 0 was 'a', now 'b'"]),
        # The old name still exists but moved: positional calls change meaning.
        (
            _sig(("a", P, True), ("b", P, False)),
            _sig(("b", P, False), ("a", P, True)),
            ["positional parameter 0", "positional parameter 1", "now required"],
        ),
        (_sig(("a", K, False)), _sig(), ["keyword 'a' is gone"]),
        (_sig(("a", K, False)), _sig(("kw", "VAR_KEYWORD", False)), []),
        (_sig(), _sig(("x", K, True)), ["new required parameter 'x'"]),
        (_sig(("args", "VAR_POSITIONAL", False)), _sig(), ["*args is gone"]),
    ],
)
def test_signature_rules(old: dict[str, Any], new: dict[str, Any], found: list[str]) -> None:
    got = [str(b) for b in parity.compare_signature("f", old, new)]
    assert len(got) == len(found), got
    for text, expected in zip(got, found, strict=True):
        assert expected in text
