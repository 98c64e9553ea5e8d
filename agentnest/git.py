"""Git workspace helpers: clone, status, diff and run tests inside a sandbox.

Git runs *in the sandbox* (the image needs ``git``: build one with
``Template(apt_packages=("git",))``), under the sandbox's policy: every
command is an ``exec`` the approval hook sees and an audit event records, and
the sandbox's network policy decides which remotes are reachable.

Credentials are only ever a :class:`~agentnest.Secret`, and they never
appear in a command line (``/proc/*/cmdline``), in the environment of any
process, in an event or in the repository's configuration:

* the value goes to the sandbox on the **stdin** of a small wrapper program;
* the wrapper writes it to a file in a fresh private directory on the
  scratch tmpfs (``/tmp``, mode 0700; the file 0400), replaces every
  configured credential helper with one that only ``cat``s that file on
  ``get`` (so nothing stores it), runs ``git clone`` with terminal prompts
  off, and removes the directory when git exits, whatever happened;
* the sandbox's guard redacts the value (and its encoded forms) from
  everything returned or recorded for the rest of the sandbox's life, so a
  remote that echoes it back is caught too.

Example::

    from agentnest import Sandbox, Secret, SecurityPolicy, NetworkPolicy, Template
    from agentnest.git import GitWorkspace

    image = Template(apt_packages=("git",)).build()
    policy = SecurityPolicy(network=NetworkPolicy.allowlist(domains=("github.com",)))
    with Sandbox(image, security_policy=policy, timeout=1800) as sandbox:
        repo = GitWorkspace(sandbox)
        repo.clone("https://github.com/org/private.git", depth=1, credentials=Secret(token))
        sandbox.write_file("repo/fix.py", "...")
        print(repo.status().entries)            # (StatusEntry(path='fix.py', ..., untracked=True),)
        print(repo.diff().text)
        print(repo.run_tests("python3 -m pytest -q").summary)   # {'passed': 12, 'failed': 0}

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .config import ExecutionResult as ExecutionResult  # 0.3.0 had it here
from .errors import ConfigurationError, ExecutionError, ExecutionTimeoutError
from .runtime.launch import script_command
from .sandbox import Sandbox as Sandbox  # 0.3.0 had it here
from .secrets import Secret

__all__ = [
    "CloneResult",
    "DiffFile",
    "ExecutionResult",
    "GitDiff",
    "GitError",
    "GitStatus",
    "GitWorkspace",
    "Sandbox",
    "StatusEntry",
    "TestRun",
]

#: Default seconds for a clone (a network operation) and for other git commands.
CLONE_TIMEOUT = 600.0
GIT_TIMEOUT = 120.0
#: Default seconds a test run may take.
TEST_TIMEOUT = 1800.0

#: Options every git command gets: no pager, no colours, no prompts for
#: anything, and paths printed as they are.
_GIT = ["git", "-c", "core.pager=cat", "-c", "color.ui=false", "-c", "core.quotepath=false"]
_GIT_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}

_REF = re.compile(r"^[A-Za-z0-9._/@{}~^:+-]+$")


class GitError(ExecutionError):
    """A git command failed; ``.result`` is its :class:`~agentnest.ExecutionResult`.

    .. versionadded:: 0.4.0
    """


@dataclass(frozen=True, slots=True)
class CloneResult(ExecutionResult):
    """What :meth:`GitWorkspace.clone` did: the ``git clone`` command's result, and more.

    An :class:`~agentnest.ExecutionResult` (0.3.0's ``clone`` returned one):
    ``exit_code``, ``stdout``, ``stderr`` (git's progress, redacted),
    ``ok``, ``check()`` and ``output`` are the clone command's.

    .. versionadded:: 0.4.0
    """

    path: str = ""
    """The repository's directory, relative to the workspace."""
    head: str = ""
    """The checked-out commit (full hex id)."""
    branch: str | None = None
    """The checked-out branch (None for a detached HEAD)."""


@dataclass(frozen=True, slots=True)
class StatusEntry:
    """One changed path of ``git status`` (porcelain v2).

    ``index`` and ``worktree`` are git's status letters (``M`` modified,
    ``A`` added, ``D`` deleted, ``R`` renamed, ``C`` copied, ``U`` unmerged,
    ``.`` unchanged; ``?`` for untracked files).

    .. versionadded:: 0.4.0
    """

    path: str
    index: str
    worktree: str
    original_path: str | None = None
    """The path before a rename or copy."""

    @property
    def untracked(self) -> bool:
        return self.index == "?"

    @property
    def staged(self) -> bool:
        return self.index not in (".", "?")

    @property
    def conflicted(self) -> bool:
        return self.index == "U" or self.worktree == "U"


# GitStatus and GitDiff are str subclasses because 0.3.0's status() and diff()
# returned str: a 0.3.0 caller keeps its string (`if repo.status():`,
# `"calc.py" in repo.diff()`, `print(...)`), ours reads the parsed fields.  A str
# subclass cannot have __slots__, and equality and hashing stay str's (eq=False),
# so that a result equals, and hashes like, its text.


@dataclass(frozen=True, eq=False)
class GitStatus(str):
    """``git status`` of a repository, parsed; as a ``str``, ``git status --short``.

    .. versionadded:: 0.4.0
    """

    def __new__(
        cls,
        branch: str | None,
        head: str | None,
        upstream: str | None = None,
        ahead: int = 0,
        behind: int = 0,
        entries: tuple[StatusEntry, ...] = (),
        text: str = "",
    ) -> GitStatus:
        return super().__new__(cls, text)

    branch: str | None
    """The current branch (None for a detached HEAD)."""
    head: str | None
    """The current commit (None in a repository without commits)."""
    upstream: str | None = None
    ahead: int = 0
    behind: int = 0
    entries: tuple[StatusEntry, ...] = ()
    text: str = ""
    """``git status --short`` (what 0.3.0's ``status()`` returned); also the str value."""

    @property
    def clean(self) -> bool:
        """No staged, unstaged or untracked changes."""
        return not self.entries

    def __reduce__(self) -> tuple[Any, ...]:
        # str's own reduce would rebuild from the text alone (copy, pickle).
        return (type(self), _field_values(self))


@dataclass(frozen=True, slots=True)
class DiffFile:
    """One file of a diff, with its line counts (None for binary files).

    .. versionadded:: 0.4.0
    """

    path: str
    added: int | None
    deleted: int | None
    original_path: str | None = None

    @property
    def binary(self) -> bool:
        return self.added is None


@dataclass(frozen=True, eq=False)
class GitDiff(str):
    """A diff: the patch text and the files it touches; as a ``str``, the patch text.

    .. versionadded:: 0.4.0
    """

    def __new__(cls, text: str = "", files: tuple[DiffFile, ...] = (), truncated: bool = False) -> GitDiff:
        return super().__new__(cls, text)

    text: str
    """The unified diff (redacted; cut at the policy's ``max_output_bytes``)."""
    files: tuple[DiffFile, ...] = ()
    truncated: bool = False

    @property
    def empty(self) -> bool:
        return not self.files

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), _field_values(self))


def _field_values(obj: Any) -> tuple[Any, ...]:
    return tuple(getattr(obj, f.name) for f in dataclasses.fields(obj))


@dataclass(frozen=True, slots=True)
class TestRun:
    """The outcome of :meth:`GitWorkspace.run_tests`.

    ``summary`` holds the counts found in the output of pytest
    (``3 passed, 1 failed``) or unittest (``Ran 4 tests`` ... ``FAILED
    (failures=1)``); it is empty when neither format was recognised.

    .. versionadded:: 0.4.0
    """

    __test__ = False  # not a pytest test class, whatever its name says

    command: str
    exit_code: int
    stdout: str
    stderr: str
    duration: float
    timed_out: bool = False
    truncated: bool = False
    summary: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """The command exited 0 within its timeout."""
        return self.exit_code == 0 and not self.timed_out

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


class GitWorkspace:
    """Git operations on one repository directory in a sandbox's workspace.

    Args:
        sandbox: the :class:`~agentnest.Sandbox`; its image must have ``git``.
        path: the repository's directory, relative to the workspace
            (``"."`` for the workspace itself), or absolute inside it
            (0.3.0's ``directory``, such as ``/workspace/repo``).
            :meth:`clone` with ``dest`` moves the helper to the new clone.
        directory: 0.3.0's name for ``path`` (by keyword; an absolute path
            or one relative to the workspace).

    Every method runs git in the sandbox through the public API (``exec``),
    so the approval hook, the audit events and redaction all apply; a
    failing git command raises :class:`GitError` with the result attached
    (:meth:`apply_patch` returns its result instead, as in 0.3.0).

    Raises:
        ConfigurationError: the directory is outside the workspace, or both
            ``path`` and ``directory`` were given.

    .. versionadded:: 0.4.0
       ``path`` (0.3.0: ``directory``, still accepted), the parsed results,
       credentials, :meth:`run_tests`.
    """

    __slots__ = ("path", "sandbox")

    def __init__(self, sandbox: Sandbox, path: str = "repo", *, directory: str | None = None) -> None:
        self.sandbox = sandbox
        if directory is not None:
            if path != "repo":
                raise ConfigurationError("give the repository's directory once: path or directory")
            path, what = directory, "directory"
        else:
            what = "path"
        self.path = _relative(path, what, self._workdir())

    @property
    def directory(self) -> str:
        """The repository's absolute directory in the sandbox (0.3.0's attribute).

        Setting it moves the helper, as setting ``path`` does.
        """
        return posixpath.normpath(posixpath.join(self._workdir(), self.path))

    @directory.setter
    def directory(self, value: str) -> None:
        self.path = _relative(value, "directory", self._workdir())

    def _workdir(self) -> str:
        return str(self.sandbox.config.workdir)

    # -- clone ------------------------------------------------------------------------

    def clone(
        self,
        url: str,
        *,
        ref: str | None = None,
        depth: int | None = 1,
        branch: str | None = None,
        credentials: Secret | None = None,
        username: str = "x-access-token",
        dest: str | None = None,
        timeout: float = CLONE_TIMEOUT,
    ) -> CloneResult:
        """Clone ``url`` into ``dest`` (default: this helper's ``path``).

        Args:
            url: ``https://``, ``http://``, ``ssh://``, ``git://`` or
                ``file://`` (a local path works too).  Put no credentials
                in it: it shows in command lines and events.
            ref: 0.3.0's name for ``branch``.
            depth: shallow clone with this many commits (default 1, as in
                0.3.0; ``None`` for the whole history).  For local sources
                use a ``file://`` URL: git ignores depth for plain paths.
            branch: branch or tag to check out.
            credentials: the password or token, as a :class:`Secret`, given
                to git when an HTTP(S) remote asks for credentials (SSH keys
                are not supported).
            username: the user name given with it; token-based hosts accept any.
            dest: the directory to clone into, relative to the workspace;
                the helper then works on it.
            timeout: seconds before the clone is killed.

        Returns:
            A :class:`CloneResult`: the clone command's
            :class:`~agentnest.ExecutionResult` (what 0.3.0 returned) with
            the path, head and branch.

        Raises:
            ConfigurationError: a bad argument (``credentials`` not a Secret,
                a URL with a password in it, an option-like branch...).
            GitError: git failed (unreachable, refused, authentication);
                ``.result`` is the failed command's result.  (0.3.0 returned
                it instead; raising keeps a program from working on a
                repository that is not there.)
        """
        if ref is not None:
            if branch is not None:
                raise ConfigurationError("give the branch once: branch= or ref= (0.3.0's name)")
            branch = ref
        url = _text(url, "url")
        if url.startswith("-") or not url:
            raise ConfigurationError(f"url={url!r} is not a repository URL")
        if re.match(r"^[a-z][a-z0-9+.-]*://[^/@]*:[^/@]*@", url, re.IGNORECASE):
            raise ConfigurationError(
                "the url carries a password; pass it as credentials=Secret(...) so that it never "
                "shows in command lines, events or the clone's configuration"
            )
        if credentials is not None and not isinstance(credentials, Secret):
            raise ConfigurationError(
                "credentials must be an agentnest.Secret, so that they are redacted everywhere; "
                f"got {type(credentials).__name__}"
            )
        target = _relative(dest, "dest", self._workdir()) if dest is not None else self.path
        args = ["clone", "--no-hardlinks"]
        if branch is not None:
            args += ["--branch", _ref(branch, "branch")]
        if depth is not None:
            if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
                raise ConfigurationError(f"depth={depth!r} must be a positive int")
            args += ["--depth", str(depth)]
        argv = [*_GIT, "-c", "credential.helper=", *args, "--", url, target]
        if credentials is None:
            result = self._run(argv, cwd=None, timeout=timeout, what="git clone")
        else:
            username = _text(username, "username")
            value = credentials.get_secret_value()
            if "\n" in value or "\0" in value:
                raise ConfigurationError("credentials cannot contain newline or NUL characters")
            # Registered before anything runs: from now on the guard redacts
            # the value (and its encoded forms) wherever it shows up.
            self.sandbox.add_secret(value)
            result = self._run(
                # agent/git_clone.py: credentials from stdin, never in argv or env.
                script_command("python3", "git_clone", *argv),
                cwd=None,
                timeout=timeout,
                input=f"username={username}\npassword={value}\n",
                what="git clone",
            )
        if dest is not None:
            self.path = target
        head = self._git(["rev-parse", "HEAD"]).stdout.strip()
        current = self._git(["symbolic-ref", "-q", "--short", "HEAD"], check=False)
        fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(ExecutionResult) if f.init}
        return CloneResult(
            **fields,
            path=target,
            head=head,
            branch=(current.stdout.strip() or None) if current.ok else None,
        )

    # -- inspecting ---------------------------------------------------------------------

    def status(self, *, untracked: bool = True) -> GitStatus:
        """``git status`` parsed: branch, upstream, ahead/behind and changed paths.

        The result is also a ``str``: ``git status --short``, what 0.3.0's
        ``status()`` returned (there untracked directories show as one
        entry, as git shows them; ``entries`` lists every file).

        Args:
            untracked: list untracked files (every file, not just directories).
        """
        result = self._git(
            [
                "status",
                "--porcelain=v2",
                "--branch",
                "-z",
                f"--untracked-files={'all' if untracked else 'no'}",
            ]
        )
        short = self._git(["status", "--short", *(() if untracked else ("--untracked-files=no",))])
        return dataclasses.replace(_parse_status(result.stdout), text=short.stdout)

    def diff(
        self,
        ref: str | None = None,
        *,
        staged: bool = False,
        paths: Sequence[str] = (),
        context: int = 3,
    ) -> GitDiff:
        """The diff of the working tree (or the index with ``staged=True``).

        Args:
            ref: compare against this commit instead of the index (``HEAD``,
                ``main``, ``HEAD~2``...); with ``staged=True``, the index
                against it.
            staged: the staged changes (``git diff --cached``).
            paths: limit the diff to these paths (relative to the repository).
            context: lines of context around each change.

        Untracked files are not in a diff (as in git); :meth:`status` lists them.
        The result is also a ``str``, the patch text (0.3.0's ``diff()``
        returned that).
        """
        if isinstance(context, bool) or not isinstance(context, int) or not 0 <= context <= 1000:
            raise ConfigurationError(f"context={context!r} must be an int from 0 to 1000")
        args = ["diff", "--no-ext-diff", "--no-textconv", "-M"]
        if staged:
            args.append("--cached")
        if ref is not None:
            args.append(_ref(ref, "ref"))
        spec = ["--", *(_text(p, "paths item") for p in paths)]
        numstat = self._git([*args, "--numstat", "-z", *spec])
        patch = self._git([*args, f"--unified={context}", *spec])
        return GitDiff(
            text=patch.stdout,
            files=_parse_numstat(numstat.stdout),
            truncated=patch.truncated or numstat.truncated,
        )

    # -- changing --------------------------------------------------------------------------

    def apply_patch(self, patch: str | bytes, *, timeout: float = GIT_TIMEOUT) -> ExecutionResult:
        """Apply a unified diff to the working tree (``git apply``), as 0.3.0 did.

        The patch goes to git on its stdin (no file is left in the
        repository).  A patch that does not apply is a result, not an error:
        check ``ok`` (or call ``check()``); nothing was changed then.

        Args:
            patch: the diff, as :meth:`diff` returns it.
            timeout: seconds before git is killed.

        Returns:
            The ``git apply`` command's :class:`~agentnest.ExecutionResult`.

        .. versionadded:: 0.4.0
           (0.3.0 wrote the patch to ``.agentnest.patch`` in the workspace first.)
        """
        if not isinstance(patch, (str, bytes)):
            raise ConfigurationError(f"patch must be str or bytes, not {type(patch).__name__}")
        return self._run(
            [*_GIT, "-C", self.path, "apply", "--whitespace=nowarn", "-"],
            cwd=None,
            timeout=timeout,
            input=patch,
            check=False,
            what="git apply",
        )

    # -- testing -------------------------------------------------------------------------

    def run_tests(
        self,
        command: str = "python3 -m pytest -q",
        *,
        timeout: float = TEST_TIMEOUT,
        env: dict[str, str | Secret] | None = None,
    ) -> TestRun:
        """Run the test command (``/bin/sh -c``) in the repository.

        A failing or timed-out run is a result (``ok=False``), not an error:
        the output says what failed.  A timed-out run's processes are killed;
        the sandbox lives on.

        Args:
            command: the shell command line.
            timeout: seconds before the run is killed (``timed_out=True``).
            env: extra environment (``Secret`` values are redacted).
        """
        command = _text(command, "command")
        try:
            result = self.sandbox.exec_shell(command, cwd=self.path, timeout=timeout, env=env)
        except ExecutionTimeoutError as exc:
            partial = exc.result
            assert isinstance(partial, ExecutionResult)
            result = partial
        return TestRun(
            command=command,
            exit_code=result.exit_code,
            stdout=result.stdout,
            stderr=result.stderr,
            duration=result.duration,
            timed_out=result.timed_out,
            truncated=result.truncated,
            summary=_summary(result.stdout + "\n" + result.stderr),
        )

    # -- helpers ---------------------------------------------------------------------------

    def _git(self, args: list[str], *, check: bool = True) -> ExecutionResult:
        # -C rather than cwd: relative to the workspace, whatever the command's directory.
        return self._run(
            [*_GIT, "-C", self.path, *args], cwd=None, timeout=GIT_TIMEOUT, check=check, what=f"git {args[0]}"
        )

    def _run(
        self,
        argv: list[str],
        *,
        cwd: str | None,
        timeout: float,
        input: str | bytes | None = None,
        check: bool = True,
        what: str | None = None,
    ) -> ExecutionResult:
        result = self.sandbox.exec(argv, cwd=cwd, timeout=timeout, env=_GIT_ENV, input=input)
        if check and not result.ok:
            name = what or argv[0]
            lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
            # git's own verdict ("fatal: ...") says more than its last line of advice.
            verdicts = [line for line in lines if line.startswith(("fatal:", "error:"))]
            detail = (verdicts or lines or [f"exit code {result.exit_code}"])[0][:500]
            raise GitError(f"{name} failed: {detail}", result)
        return result

    def __repr__(self) -> str:
        return f"<GitWorkspace {self.path!r} in {self.sandbox!r}>"


# -- parsing (pure) ---------------------------------------------------------------------------


def _parse_status(text: str) -> GitStatus:
    branch: str | None = None
    head: str | None = None
    upstream: str | None = None
    ahead = behind = 0
    entries: list[StatusEntry] = []
    records = text.split("\0")
    i = 0
    while i < len(records):
        rec = records[i]
        i += 1
        if not rec:
            continue
        if rec.startswith("# "):
            key, _, value = rec[2:].partition(" ")
            if key == "branch.oid":
                head = None if value == "(initial)" else value
            elif key == "branch.head":
                branch = None if value == "(detached)" else value
            elif key == "branch.upstream":
                upstream = value
            elif key == "branch.ab":
                a, _, b = value.partition(" ")
                ahead, behind = int(a.lstrip("+") or 0), int(b.lstrip("-") or 0)
        elif rec[0] == "1":
            parts = rec.split(" ", 8)
            entries.append(StatusEntry(parts[8], parts[1][0], parts[1][1]))
        elif rec[0] == "2":
            parts = rec.split(" ", 9)
            original = records[i] if i < len(records) else None
            i += 1
            entries.append(StatusEntry(parts[9], parts[1][0], parts[1][1], original))
        elif rec[0] == "u":
            parts = rec.split(" ", 10)
            entries.append(StatusEntry(parts[10], parts[1][0], parts[1][1]))
        elif rec[0] == "?":
            entries.append(StatusEntry(rec[2:], "?", "?"))
    return GitStatus(branch, head, upstream, ahead, behind, tuple(entries))


def _parse_numstat(text: str) -> tuple[DiffFile, ...]:
    files: list[DiffFile] = []
    records = text.split("\0")
    i = 0
    while i < len(records):
        rec = records[i]
        i += 1
        if not rec:
            continue
        added, deleted, path = [*rec.split("\t", 2), "", ""][:3]
        original = None
        if path == "":  # a rename: the two paths follow as their own records
            original = records[i] if i < len(records) else None
            path = records[i + 1] if i + 1 < len(records) else ""
            i += 2
        files.append(
            DiffFile(
                path=path,
                added=int(added) if added.isdigit() else None,
                deleted=int(deleted) if deleted.isdigit() else None,
                original_path=original,
            )
        )
    return tuple(files)


_PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected|warnings?)\b")
_PYTEST_LINE = re.compile(r"^=*\s*(?:\d+ \w+(?:, )?)+.*? in [\d.]+s", re.MULTILINE)
_UNITTEST_RAN = re.compile(r"^Ran (\d+) tests? in ", re.MULTILINE)
_UNITTEST_END = re.compile(r"^(OK|FAILED)(?: \(([^)]*)\))?\s*$", re.MULTILINE)


def _summary(output: str) -> dict[str, int]:
    """Test counts from pytest's or unittest's closing lines."""
    lines = _PYTEST_LINE.findall(output)
    if lines:
        counts: dict[str, int] = {}
        for number, word in _PYTEST_COUNT.findall(lines[-1]):
            key = {"error": "errors", "warning": "warnings"}.get(word, word)
            counts[key] = int(number)
        return counts
    ran = _UNITTEST_RAN.findall(output)
    if ran:
        counts = {"ran": int(ran[-1])}
        ends = _UNITTEST_END.findall(output)
        if ends:
            for item in ends[-1][1].split(","):
                name, _, number = item.strip().partition("=")
                if number.isdigit():
                    counts[name] = int(number)
        failed = counts.get("failures", 0) + counts.get("errors", 0)
        counts["failed"] = failed
        counts["passed"] = (
            counts["ran"] - failed - counts.get("skipped", 0) - counts.get("expected failures", 0)
        )
        return counts
    return {}


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ConfigurationError(f"{what} must be str, not {type(value).__name__}")
    if "\0" in value or "\n" in value:
        raise ConfigurationError(f"{what} cannot contain NUL or newline characters")
    return value


def _relative(path: str | None, what: str, workdir: str | None = None) -> str:
    """``path`` relative to the workspace; an absolute one must lie inside ``workdir``."""
    path = _text(path, what)
    norm = posixpath.normpath(path)
    if workdir is not None and norm.startswith("/"):
        # 0.3.0 spelled directories absolute (/workspace/repo): same directory.
        root = posixpath.normpath(workdir)
        if norm == root or norm.startswith(root.rstrip("/") + "/"):
            norm = posixpath.relpath(norm, root)
    if not path or norm.startswith("/") or norm == ".." or norm.startswith("../") or norm.startswith("-"):
        where = f" (or absolute inside {workdir})" if workdir is not None else ""
        raise ConfigurationError(f"{what}={path!r} must be a directory relative to the workspace{where}")
    return norm


def _ref(value: str, what: str) -> str:
    value = _text(value, what)
    if value.startswith("-") or not _REF.match(value):
        raise ConfigurationError(f"{what}={value!r} is not a valid git ref name")
    return value
