"""Approval hooks: what asks before an operation runs, and the built-in ones.

An approval hook is any callable that takes an :class:`ApprovalRequest` and
answers truthy (allow) or falsy (deny); it may be a coroutine function.  A
hook that raises, or that does not answer within the policy's
``approval_timeout``, denies.  The guard asks before every operation (see
:data:`APPROVAL_KINDS`) and emits ``approval.requested`` then
``approval.granted`` or ``approval.denied`` (followed by ``policy.denied``).

Built in:

* :func:`allow_all` and :func:`deny_all`;
* :class:`RuleApprover`: glob patterns on commands and paths, first match
  wins, loadable from YAML (:meth:`RuleApprover.from_yaml`, or the
  ``approvals:`` key of a profile);
* :class:`PromptApprover`: asks a person at a terminal (``agentnest run
  --approve prompt``).

Example::

    rules = RuleApprover(
        [ApprovalRule("exec", "rm *", "deny"), ApprovalRule("exec", "python3 *", "allow")],
        default="deny",
    )
    Sandbox(security_policy=SecurityPolicy(approval_hook=rules))

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import asyncio
import fnmatch
import inspect
import os
import shlex
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TextIO

from .errors import ConfigurationError

APPROVAL_KINDS = (
    "exec",
    "file.list",
    "file.read",
    "file.remove",
    "file.write",
    "fork",
    "network",
    "restore",
    "session.run",
    "snapshot",
)
"""Operation kinds the guard asks about (``ApprovalRequest.kind``)."""


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """What an approval hook is asked to allow.

    ``details`` by kind: ``exec``: ``argv`` (list, secrets redacted), ``command``
    (the argv joined as a shell would quote it), ``cwd``; ``file.*``: ``path``
    (absolute, in the workspace) and, for writes, ``size``; ``session.run``:
    ``session``, ``code``; ``snapshot``/``restore``: ``path`` on the host;
    ``fork``: ``image``, ``timeout``; ``network``: ``mode``, ``domains``.

    .. versionadded:: 0.4.0
    """

    kind: str
    """One of :data:`APPROVAL_KINDS`."""
    sandbox_id: str
    details: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def subject(self) -> str:
        """What rules match against: the command line, the path, or the code."""
        d = self.details
        for key in ("command", "path", "code", "pattern", "image", "mode"):
            value = d.get(key)
            if isinstance(value, str):
                return value
        return ""


ApprovalHook = Callable[[ApprovalRequest], Any]


def allow_all(request: ApprovalRequest) -> bool:
    """Approve everything (the same as no hook, but every request is an event)."""
    return True


def deny_all(request: ApprovalRequest) -> bool:
    """Refuse everything: a sandbox that can be created but not used."""
    return False


# Built-ins answer at once and never block: the guard calls them inline,
# without the worker thread that bounds an arbitrary hook's time.
allow_all.agentnest_inline = True  # type: ignore[attr-defined]
deny_all.agentnest_inline = True  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class ApprovalRule:
    """One rule: operations of ``kind`` whose subject matches ``match`` get ``action``.

    ``kind`` is one of :data:`APPROVAL_KINDS`, or ``*`` for any; ``match`` is a
    glob (``fnmatch``: ``*`` also crosses ``/``) on the command line for
    ``exec`` (argv joined with shell quoting: ``python3 -c 'print(1)'``), the
    absolute path for ``file.*``, the host path for ``snapshot``/``restore``,
    the code for ``session.run``, the image for ``fork`` and the mode for
    ``network``.

    .. versionadded:: 0.4.0
    """

    kind: str
    match: str
    action: str
    """``allow`` or ``deny``."""

    def __post_init__(self) -> None:
        if self.kind != "*" and self.kind not in APPROVAL_KINDS:
            raise ConfigurationError(
                f"kind {self.kind!r} is unknown; use one of {', '.join(APPROVAL_KINDS)} or '*'"
            )
        if not isinstance(self.match, str) or not self.match:
            raise ConfigurationError("match must be a non-empty glob pattern")
        if self.action not in ("allow", "deny"):
            raise ConfigurationError(f"action {self.action!r} is unknown; use 'allow' or 'deny'")

    def matches(self, request: ApprovalRequest) -> bool:
        return (self.kind in ("*", request.kind)) and fnmatch.fnmatchcase(request.subject(), self.match)


class RuleApprover:
    """Approves by rules: the first rule that matches decides, else ``default``.

    Args:
        rules: :class:`ApprovalRule` items, in order.
        default: ``allow`` or ``deny`` when no rule matches (``deny``: list
            what is allowed; ``allow``: list what is refused).
    """

    agentnest_inline = True  # pure and fast: no worker thread needed

    def __init__(self, rules: Iterable[ApprovalRule], default: str = "deny") -> None:
        self.rules = tuple(rules)
        if not all(isinstance(r, ApprovalRule) for r in self.rules):
            raise ConfigurationError("rules must be ApprovalRule items")
        if default not in ("allow", "deny"):
            raise ConfigurationError(f"default {default!r} is unknown; use 'allow' or 'deny'")
        self.default = default

    def decide(self, request: ApprovalRequest) -> tuple[bool, ApprovalRule | None]:
        """(allowed, the rule that decided or None for the default)."""
        for rule in self.rules:
            if rule.matches(request):
                return rule.action == "allow", rule
        return self.default == "allow", None

    def __call__(self, request: ApprovalRequest) -> bool:
        return self.decide(request)[0]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RuleApprover) and (other.rules, other.default) == (self.rules, self.default)

    def __hash__(self) -> int:
        return hash((self.rules, self.default))

    def __repr__(self) -> str:
        return f"RuleApprover({len(self.rules)} rules, default={self.default!r})"

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> RuleApprover:
        """Load rules from a YAML file: ``{default: deny, rules: [{kind, match, action}, ...]}``.

        Errors name the file and line, as profile errors do.  The reading is
        :func:`agentnest.profiles.load_rules` (the YAML reader of profiles).
        """
        if _rules_loader is None:  # pragma: no cover - ``import agentnest`` imports profiles
            raise ConfigurationError(
                "RuleApprover.from_yaml needs agentnest.profiles: import agentnest first"
            )
        return _rules_loader(path)


#: Reads a rules file into a :class:`RuleApprover` for :meth:`RuleApprover.from_yaml`.
#: The YAML reading and its ``file:line:`` errors belong to :mod:`agentnest.profiles`,
#: which sits above this module: it hands its ``load_rules`` down through
#: :func:`use_rules_loader` when it is imported (``import agentnest`` imports it),
#: so this module imports nothing above it.
RulesLoader = Callable[["str | os.PathLike[str]"], "RuleApprover"]
_rules_loader: RulesLoader | None = None


def use_rules_loader(loader: RulesLoader) -> None:
    """Make ``loader`` the reader behind :meth:`RuleApprover.from_yaml` (profiles.py calls this)."""
    global _rules_loader
    _rules_loader = loader


class PromptApprover:
    """Asks a person: prints the request and reads ``y`` or ``n`` from a terminal.

    Anything but ``y``/``yes`` denies, and so does end of input.  Answers are
    serialised: two operations never prompt at once.  Pair it with a long
    enough ``SecurityPolicy.approval_timeout``: a person who does not answer
    in time is a denial.
    """

    def __init__(self, input: TextIO | None = None, output: TextIO | None = None) -> None:
        self._input = input
        self._output = output
        self._lock = threading.Lock()

    def __call__(self, request: ApprovalRequest) -> bool:
        out = self._output or sys.stderr
        inp = self._input or sys.stdin
        with self._lock:
            out.write(f"agentnest: sandbox {request.sandbox_id} asks to {describe(request)}\n")
            out.write("allow? [y/N] ")
            out.flush()
            answer = inp.readline()
        return answer.strip().lower() in ("y", "yes")


def describe(request: ApprovalRequest) -> str:
    """One line for people: ``exec: python3 -c 'print(1)'``."""
    subject = request.subject()
    if len(subject) > 300:
        subject = subject[:300] + "..."
    return f"{request.kind}: {subject}" if subject else request.kind


def command_line(argv: list[str]) -> str:
    """``argv`` as one string, quoted the way a shell would need it."""
    return shlex.join(argv)


def builtin(name: str) -> ApprovalHook:
    """A built-in hook by name: ``allow``, ``deny`` or ``prompt`` (the CLI's ``--approve``)."""
    if name == "allow":
        return allow_all
    if name == "deny":
        return deny_all
    if name == "prompt":
        return PromptApprover()
    raise ConfigurationError(f"approval mode {name!r} is unknown; use 'allow', 'deny' or 'prompt'")


__all__ = [
    "APPROVAL_KINDS",
    "ApprovalHook",
    "ApprovalRequest",
    "ApprovalRule",
    "PromptApprover",
    "RuleApprover",
    "RulesLoader",
    "allow_all",
    "builtin",
    "command_line",
    "deny_all",
    "describe",
    "use_rules_loader",
]


class HookTimeout(Exception):
    """An approval hook did not answer in time (the guard denies the request)."""


def call_bounded(hook: ApprovalHook, request: ApprovalRequest, timeout: float) -> Any:
    """Call ``hook`` in a worker thread and wait at most ``timeout`` seconds (the guard's asker).

    It lives here, not in the guard, so that the guard stays pure: the thread and the event loop
    a hook may need are this module's.

    A coroutine it returns runs to completion in that thread's own event
    loop.  A hook that hangs is abandoned (a thread cannot be killed) and
    the request denied: an unanswered question is never a yes.
    """
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            answer = hook(request)
            if inspect.isawaitable(answer):
                answer = asyncio.run(_wait(answer))
            box["answer"] = answer
        except BaseException as exc:  # handed to the caller below
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="agentnest-approval", daemon=True).start()
    if not done.wait(timeout):
        raise HookTimeout
    if "error" in box:
        raise box["error"]
    return box["answer"]


async def _wait(awaitable: Any) -> Any:
    return await awaitable


def close_awaitable(awaitable: Any) -> None:
    """Close an awaitable that will never be awaited (a coroutine would warn when collected)."""
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()
