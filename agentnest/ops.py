"""Request shaping shared by both faces: from a method's arguments to what the core runs.

This module decides, once for ``Sandbox`` and ``AsyncSandbox``, how their
arguments become a :class:`~agentnest._core.Command` (0.3.0's ``environment``
and ``workdir`` aliases, the argv of ``exec_shell`` and ``exec_python``,
Python code over 100 KiB sent on stdin), how ``Sandbox(...)``'s arguments
become a configuration and a policy, and how ``profile=`` and ``preset=``
fill in arguments.  It waits for nothing and runs nothing.

A command's shaping function takes the parameters of its face method, in
the same order, so that ``Sandbox`` passes them on positionally in one line;
``tests/unit/test_parity.py`` pins the order.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, overload

from ._aliases import either
from ._core import Command
from .config import ExecutionResult, ResourceLimits, SandboxConfig
from .errors import ConfigurationError, ExecutionError, UnsupportedCapabilityError
from .policy import NetworkPolicy, SecurityPolicy
from .profiles import profile_kwargs
from .runtime.base import Capability, RuntimeBackend
from .runtime.registry import get_backend
from .secrets import Secret

#: Python code longer than this goes to the interpreter on stdin, not argv.
MAX_INLINE_CODE = 100 * 1024

_F = TypeVar("_F", bound=Callable[..., Any])
Env = Mapping[str, str | Secret] | None


@overload
def with_profile(fn: _F) -> _F: ...
@overload
def with_profile(*, image: bool = True) -> Callable[[_F], _F]: ...
def with_profile(fn: _F | None = None, *, image: bool = True) -> _F | Callable[[_F], _F]:
    """Let ``profile=`` and ``preset=`` fill in every argument the caller did not pass explicitly.

    ``image=False`` leaves a preset's image for later (``AsyncSandbox.create``
    resolves it, which may build it, in its worker thread, not on the event loop).
    """
    if fn is None:
        return functools.partial(with_profile, image=image)
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        profile = kwargs.pop("profile", None)
        if profile is None and kwargs.get("preset") is None:
            return fn(*args, **kwargs)
        given = dict(signature.bind_partial(*args, **kwargs).arguments)
        first = given.pop(next(iter(signature.parameters)))  # self or cls
        if profile is not None:
            given = profile_kwargs(profile, given)
        if given.get("preset") is not None:
            from .browser.image import preset_kwargs

            given = preset_kwargs(given, image=image)
        return fn(first, **given)

    return call


def default_image() -> str:
    """The image ``Sandbox()`` uses when none is given (built by ``agentnest image base``)."""
    from .runtime.docker.images import base_image

    return os.environ.get("AGENTNEST_IMAGE") or base_image()


def text(value: object, what: str) -> str:
    """``value`` if it is a str, else ConfigurationError naming ``what``."""
    if not isinstance(value, str):
        raise ConfigurationError(f"{what} must be str, not {type(value).__name__}")
    return value


# -- creation ------------------------------------------------------------------------


def workspace_medium(
    workspace: str | None,
    disk: int | str | None,
    workspace_size: int | str | None,
    capabilities: frozenset[Capability],
) -> tuple[str, int | str | None]:
    """Where the workspace lives, and its size, from ``Sandbox(workspace=, disk=, workspace_size=)``.

    ``workspace=None`` picks the disk when the backend has a storage pool
    (:attr:`Capability.DISK_WORKSPACE`) and memory otherwise; asking for the
    disk where there is none is refused rather than quietly given memory.
    """
    if workspace not in (None, "disk", "memory"):
        raise ConfigurationError(f"workspace={workspace!r} is not a workspace kind; use 'disk' or 'memory'")
    if disk is not None and workspace_size is not None and disk != workspace_size:
        raise ConfigurationError("disk= and workspace_size= both set the workspace's size; pass one of them")
    if disk is not None and workspace == "memory":
        raise ConfigurationError(
            "disk= sizes a disk workspace, and workspace='memory' asks for a tmpfs; "
            "use workspace_size= for the tmpfs, or drop workspace='memory'"
        )
    size = disk if disk is not None else workspace_size
    has_disk = Capability.DISK_WORKSPACE in capabilities
    if workspace == "disk" or disk is not None:
        if not has_disk:
            raise UnsupportedCapabilityError(
                "this backend has no storage pool for a disk workspace (disk=/workspace='disk'); "
                "make one as root with `agentnest setup` (the engine must run on this host), "
                "or use workspace='memory'; no sandbox was created"
            )
        return "disk", size
    if workspace == "memory":
        return "memory", size
    return ("disk" if has_disk else "memory"), size


def sandbox_setup(
    image: str | None,
    timeout: float,
    *,
    environment: Mapping[str, str | Secret] | None,
    workdir: str,
    network_enabled: bool,
    memory: int | str,
    cpus: float,
    pids: int,
    gpus: int,
    workspace_size: int | str | None,
    scratch_size: int | str | None,
    backend: str | RuntimeBackend,
    read_only_root: bool,
    security_policy: SecurityPolicy | None,
    disk: int | str | None,
    workspace: str | None,
    preset: str | None,
) -> tuple[RuntimeBackend, SandboxConfig, SecurityPolicy]:
    """The backend, configuration and policy ``Sandbox(...)``'s arguments describe."""
    policy = security_policy or SecurityPolicy()
    network = policy.network
    if network_enabled:
        if security_policy is not None and network != NetworkPolicy.denied():
            raise ConfigurationError("pass either network_enabled=True or a SecurityPolicy network, not both")
        network = NetworkPolicy.open()
    runtime = get_backend(backend) if isinstance(backend, str) else backend
    if not isinstance(runtime, RuntimeBackend):
        raise ConfigurationError("backend must be a backend name or a RuntimeBackend instance")
    medium, size = workspace_medium(workspace, disk, workspace_size, runtime.capabilities())
    config = SandboxConfig(
        image=image if image is not None else default_image(),
        lifetime=timeout,
        environment=environment,  # type: ignore[arg-type]  # frozen in __post_init__
        workdir=workdir,
        network=network,
        limits=ResourceLimits.build(memory, cpus, pids, size, scratch_size, gpus, medium),
        read_only_root=read_only_root,
        seccomp_profile=policy.seccomp_profile,
        apparmor_profile=policy.apparmor_profile,
        rootless=policy.rootless,
        proxy_image=policy.egress_proxy_image,
        preset=preset,
    )
    return runtime, config, policy


# -- commands --------------------------------------------------------------------------


def exec_(
    command: Sequence[str],
    timeout: float | None = None,
    env: Env = None,
    cwd: str | None = None,
    input: str | bytes | None = None,
    environment: Env = None,
    workdir: str | None = None,
    display_command: str | None = None,
    interactive: bool = False,
    pty: tuple[int, int] | None = None,
) -> Command:
    """``exec`` and ``stream_exec``: an argv as given (``interactive``, ``pty``: streams only)."""
    if not isinstance(interactive, bool):
        raise ConfigurationError("interactive must be True or False")
    return Command(
        command,
        timeout,
        either(env, environment, "env", "environment"),
        either(cwd, workdir, "cwd", "workdir"),
        input,
        display_command,
        keep_stdin_open=interactive or pty is not None,
        pty=pty,
    )


def exec_shell(
    script: str,
    timeout: float | None = None,
    env: Env = None,
    cwd: str | None = None,
    input: str | bytes | None = None,
    environment: Env = None,
    workdir: str | None = None,
) -> Command:
    """``/bin/sh -c script``, shown as the script itself."""
    return exec_(
        ["/bin/sh", "-c", text(script, "script")],
        timeout=timeout,
        env=either(env, environment, "env", "environment"),
        cwd=either(cwd, workdir, "cwd", "workdir"),
        input=input,
        display_command=script,
    )


def exec_python(
    code: str,
    timeout: float | None = None,
    env: Env = None,
    cwd: str | None = None,
    input: str | bytes | None = None,
    environment: Env = None,
    workdir: str | None = None,
) -> Command:
    """``python3 -c code``; code over :data:`MAX_INLINE_CODE` goes on stdin (then no ``input``)."""
    code = text(code, "code")
    env = either(env, environment, "env", "environment")
    cwd = either(cwd, workdir, "cwd", "workdir")
    if len(code.encode("utf-8", "surrogateescape")) > MAX_INLINE_CODE:
        if input is not None:
            raise ConfigurationError(
                "code longer than 100 KiB is sent on stdin, so input= cannot be used with it; "
                "write the code to a file with write_file and run it instead"
            )
        return exec_(
            ["python3", "-"], timeout=timeout, env=env, cwd=cwd, input=code, display_command=PYTHON_LABEL
        )
    return exec_(
        python_argv(code), timeout=timeout, env=env, cwd=cwd, input=input, display_command=PYTHON_LABEL
    )


#: How results and audit events name Python code run by ``exec_python``.
PYTHON_LABEL = "python -c <code>"


def python_argv(code: str) -> list[str]:
    return ["python3", "-c", text(code, "code")]


def run_code(code: str, language: str = "python", *, timeout: float | None = None) -> Command:
    """``run_code``: a snippet in ``python`` or ``shell``."""
    if language in ("python", "py", "python3"):
        return exec_python(code, timeout=timeout)
    if language in ("shell", "sh", "bash"):
        return exec_shell(code, timeout=timeout)
    raise ConfigurationError(f"language {language!r} is not supported; use 'python' or 'shell'")


def stream_shell(
    script: str,
    timeout: float | None = None,
    env: Env = None,
    cwd: str | None = None,
    environment: Env = None,
    workdir: str | None = None,
) -> Command:
    """``stream_shell``: as :func:`exec_shell`, without input."""
    return exec_shell(script, timeout=timeout, env=env, cwd=cwd, environment=environment, workdir=workdir)


def stream_python(
    code: str,
    timeout: float | None = None,
    env: Env = None,
    cwd: str | None = None,
    environment: Env = None,
    workdir: str | None = None,
) -> Command:
    """``stream_python``: ``python3 -c code`` (always in argv: a stream keeps stdin for the caller)."""
    return exec_(
        python_argv(code),
        timeout=timeout,
        env=either(env, environment, "env", "environment"),
        cwd=either(cwd, workdir, "cwd", "workdir"),
        display_command=PYTHON_LABEL,
    )


def exec_json(
    code: str,
    timeout: float | None = None,
    env: Env = None,
    cwd: str | None = None,
    environment: Env = None,
    workdir: str | None = None,
) -> Command:
    """``exec_json``: the code as :func:`exec_python` runs it (its result goes to :func:`parse_json`)."""
    return exec_python(code, timeout=timeout, env=env, cwd=cwd, environment=environment, workdir=workdir)


def parse_json(result: ExecutionResult) -> Any:
    """The one JSON document ``exec_json``'s code printed (ExecutionError if it failed or printed none)."""
    result = result.check()
    try:
        return json.loads(result.stdout)
    except ValueError as exc:
        raise ExecutionError(f"the code's stdout is not JSON: {exc}", result) from None
