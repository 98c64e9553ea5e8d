"""Throwaway venvs holding the stock E2B SDKs from PyPI (tests and benchmarks of the E2B face).

The E2B face of ``agentnest serve`` is checked with the SDKs people actually run:
``e2b`` and ``e2b-code-interpreter`` installed by pip from the package index into a
venv of their own, never imported by AgentNest itself.  :func:`sdk_venv` makes such
a venv once and reuses it::

    python = sdk_venv("e2b-2.63", MATRIX["e2b-2.63"])
    subprocess.run([str(python), "driver.py"], env={..., "E2B_API_URL": url})

The venvs live under ``$AGENTNEST_E2B_SDK_CACHE`` (default
``${XDG_CACHE_HOME:-~/.cache}/agentnest/e2b-sdk``), one directory per name.  A venv is
built in a temporary directory beside its final place and renamed into it only once
pip succeeded, with a stamp file naming its requirements: a build that died half-way
leaves nothing that looks usable, and a changed requirement list builds anew.  Two
processes building the same name wait on a lock; the second finds the first's venv.

Use the venv's interpreter only (``python -m ...``): a renamed venv's console
scripts keep the temporary directory in their ``#!`` line.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from agentnest.errors import ConfigurationError, MissingDependencyError

#: The pinned SDK sets the acceptance suite (tests/e2b) runs against, by name.
#:
#: * ``e2b-2.50``: the last ``e2b`` before 2.51 moved create and connect to
#:   ``POST /v2/sandboxes...``, so the old routes stay covered.  Its code interpreter is
#:   2.10.0, the newest release whose requirement (``e2b>=2.44.0,<3``) admits 2.50.0
#:   (2.10.1 needs ``e2b>=2.52.0``; 2.10.4 and every 2.11 need ``>=2.55``).
#: * ``e2b-2.63``: the newest ``e2b`` and ``e2b-code-interpreter`` on PyPI when this was
#:   written, with the smolagents release AgentNest's own extra is tested with (its
#:   ``E2BExecutor`` drives a scripted ``CodeAgent`` against the server).
MATRIX: Mapping[str, tuple[str, ...]] = {
    "e2b-2.50": ("e2b==2.50.0", "e2b-code-interpreter==2.10.0"),
    "e2b-2.63": ("e2b==2.63.0", "e2b-code-interpreter==2.11.5", "smolagents==1.26.0"),
}

#: The newest pinned set (the benchmark's, and the one with smolagents).
NEWEST = "e2b-2.63"

#: The SDK's own floor: ``e2b`` 2.63 needs Python 3.11 (older releases allowed 3.10, but
#: one floor keeps the whole matrix on one interpreter).
MIN_PYTHON = (3, 11)

#: The stamp written last into a finished venv: its requirements and what pip installed.
STAMP = "agentnest-e2bsdk.json"
#: pip's own time limit for one install (a cold cache downloads a few dozen wheels).
PIP_TIMEOUT = 900.0


def cache_root() -> Path:
    """Where the venvs live: ``$AGENTNEST_E2B_SDK_CACHE``, else ``$XDG_CACHE_HOME/agentnest/e2b-sdk``."""
    explicit = os.environ.get("AGENTNEST_E2B_SDK_CACHE", "")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "agentnest" / "e2b-sdk"


def unsupported_reason() -> str | None:
    """Why the SDK cannot run on this interpreter (a reason to print when skipping), or None."""
    if sys.version_info < MIN_PYTHON:
        have = ".".join(map(str, sys.version_info[:3]))
        need = ".".join(map(str, MIN_PYTHON))
        return f"the E2B SDK needs Python >= {need} (e2b 2.63 requires it); this is Python {have}"
    return None


def latest_matrix(today: datetime.date | None = None) -> dict[str, tuple[str, ...]]:
    """The canary set: whatever ``e2b`` and ``e2b-code-interpreter`` PyPI serves today.

    Its name carries the date, so a venv of it is reused on the same day only; smolagents
    stays pinned (the canary watches the SDK, not the framework).
    """
    day = (today or datetime.date.today()).isoformat()
    smolagents = next(r for r in MATRIX[NEWEST] if r.startswith("smolagents"))
    return {f"latest-{day}": ("e2b", "e2b-code-interpreter", smolagents)}


def sdk_venv(name: str, requirements: Sequence[str], *, python: str | None = None) -> Path:
    """The python of a venv named ``name`` holding ``requirements``, made on first use.

    Idempotent: a finished venv whose stamp lists the same requirements is returned as it
    is; any other (missing, half-built, different requirements) is built anew.

    Args:
        name: the venv's directory name under :func:`cache_root` (letters, digits, ``.-_``).
        requirements: pip requirement strings, e.g. ``["e2b==2.63.0"]``.
        python: the interpreter to make the venv with (default: this one).

    Returns:
        The venv's ``bin/python``.

    Raises:
        ConfigurationError: a bad name or requirement list, or an unusable cache directory.
        MissingDependencyError: the venv could not be made, or pip could not install the
            requirements (the message holds the end of pip's output).
    """
    if not name or name.startswith(".") or not all(c.isalnum() or c in ".-_" for c in name):
        raise ConfigurationError(f"SDK venv name {name!r:.80} must be letters, digits, '.', '-' or '_'")
    wanted = [str(r) for r in requirements]
    if not wanted or not all(r.strip() and not r.startswith("-") for r in wanted):
        raise ConfigurationError(
            f"SDK venv {name}: requirements must be non-empty pip requirements: {wanted}"
        )
    root = cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot create the E2B SDK cache {root}: {exc}; "
            "set AGENTNEST_E2B_SDK_CACHE to a writable directory"
        ) from exc
    final = root / name
    with _locked(root / f".{name}.lock"):
        if stamp(final).get("requirements") == wanted and (final / "bin" / "python").exists():
            return final / "bin" / "python"
        # Leftovers of runs that died mid-build hold no lock any more: remove them first.
        for stale in root.glob(f".build-{name}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".build-{name}-"))
        try:
            _build(tmp / "venv", name, wanted, python or sys.executable)
            if final.exists() or final.is_symlink():
                os.replace(final, tmp / "old")
            os.replace(tmp / "venv", final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final / "bin" / "python"


def stamp(venv: Path) -> dict[str, object]:
    """The stamp of a finished venv (``requirements``, ``installed`` versions, ``python``), or ``{}``."""
    try:
        data = json.loads((venv / STAMP).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def prune(keep: Sequence[str] = (), prefix: str = "latest-") -> list[Path]:
    """Remove the venvs whose name starts with ``prefix`` except ``keep`` (old canaries)."""
    root = cache_root()
    gone = []
    with contextlib.suppress(FileNotFoundError):
        for entry in root.iterdir():
            if entry.name.startswith(prefix) and entry.name not in keep and entry.is_dir():
                with _locked(root / f".{entry.name}.lock"):
                    shutil.rmtree(entry, ignore_errors=True)
                (root / f".{entry.name}.lock").unlink(missing_ok=True)
                gone.append(entry)
    return gone


def _build(venv: Path, name: str, requirements: list[str], python: str) -> None:
    """Make the venv at ``venv``, install ``requirements``, write the stamp last."""
    _run(
        [python, "-m", "venv", str(venv)],
        what=f"make the venv {name}",
        hint="on Debian the venv module is in the python3-venv package",
        timeout=300.0,
    )
    vpython = venv / "bin" / "python"
    _run(
        [str(vpython), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *requirements],
        what=f"install {' '.join(requirements)} into the venv {name}",
        hint="the package index must be reachable; pip's own configuration applies",
        timeout=PIP_TIMEOUT,
    )
    found = _installed(vpython, requirements)
    found["requirements"] = requirements
    found["built"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    (venv / STAMP).write_text(json.dumps(found, indent=2) + "\n")


def _installed(python: Path, requirements: list[str]) -> dict[str, object]:
    """The venv's Python and the installed version of each requirement (what ``latest`` got)."""
    names = [_dist_name(r) for r in requirements]
    script = (
        "import importlib.metadata as m, json, platform, sys\n"
        "print(json.dumps({'python': platform.python_version(),"
        " 'installed': {n: m.version(n) for n in sys.argv[1:]}}))\n"
    )
    out = _run(
        [str(python), "-c", script, *names], what="read the installed versions", hint="", timeout=120.0
    )
    found: dict[str, object] = json.loads(out)
    return found


def _dist_name(requirement: str) -> str:
    for i, c in enumerate(requirement):
        if not (c.isalnum() or c in "-_."):
            return requirement[:i]
    return requirement


def _run(argv: list[str], *, what: str, hint: str, timeout: float) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MissingDependencyError(f"could not {what}: {exc}") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-3000:]
        more = f" ({hint})" if hint else ""
        raise MissingDependencyError(f"could not {what}: exit {done.returncode}{more}:\n{tail}")
    return done.stdout


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


__all__ = [
    "MATRIX",
    "MIN_PYTHON",
    "NEWEST",
    "cache_root",
    "latest_matrix",
    "prune",
    "sdk_venv",
    "stamp",
    "unsupported_reason",
]
