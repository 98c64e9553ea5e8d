"""Fork: branch a sandbox into a new one with the same files.  See :meth:`Sandbox.fork`."""

from __future__ import annotations

import tarfile
from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING

from ..events import EventType
from ..runtime.base import Capability
from .archive import _Gate
from .programs import _host_workspace, _read_program, _require, _start_extractor, _start_writer, _writer_args
from .rules import TarRules

if TYPE_CHECKING:
    from ..config import SandboxConfig
    from ..runtime.base import SandboxHandle
    from ..sandbox import Sandbox

#: How the sandbox being constructed in this context gets its handle, when
#: not from ``backend.create``: set by a host-side fork around the child's
#: constructor (a context variable: invisible to other threads and tasks,
#: and to the public signature of ``Sandbox``).
PROVISION: ContextVar[Callable[[SandboxConfig], SandboxHandle] | None] = ContextVar(
    "agentnest_provision", default=None
)


def fork(parent: Sandbox, *, timeout: float | None = None) -> Sandbox:
    """Branch ``parent`` into a new sandbox.  See :meth:`Sandbox.fork`."""
    parent._ch()  # raises SandboxDestroyedError for a destroyed parent
    _require(parent, Capability.FORK, "fork")
    config = parent.config
    guard = parent._guard
    lifetime = config.lifetime if timeout is None else timeout
    guard.approve("fork", {"image": config.image, "timeout": lifetime})
    limits = config.limits
    if limits.workspace_medium == "disk" and _host_workspace(parent) is not None:
        return _fork_on_host(parent, lifetime)
    # The parent's writer starts now and waits for a go: its interpreter
    # starts while the child's container does.  No data flows before the go,
    # so nothing piles up in the parent's channel meanwhile.
    writer = _start_writer(parent, {**_writer_args(parent), "wait": True})
    try:
        child = _create_like(parent, lifetime)
    except BaseException:
        writer.cancel()
        raise
    try:
        # Secrets passed to single commands may be in the files: the child
        # redacts everything the parent does.
        for secret in guard.secrets:
            child._guard.add_secret(secret)
        try:
            _, feeder = _start_extractor(child, limits.workspace)
        except BaseException:
            writer.cancel()
            raise
        try:
            try:
                writer.write(b"g", eof=True)
                rules = TarRules(max_bytes=limits.workspace)
                _read_program(writer, _Gate(writer.pull, feeder.send), rules)
                writer.check("the fork's tar writer")
            except BaseException:
                writer.cancel()
                raise
            # A stream without the metadata member still needs its end marker.
            feeder.send(bytes(2 * tarfile.BLOCKSIZE))
        except BaseException as exc:
            feeder.drop(exc)
            raise
        feeder.finish(commit=True)
    except BaseException:
        child.destroy()
        raise
    details = {"files": rules.files, "size": rules.size, "skipped": writer.skipped()}
    guard.emit(EventType.SANDBOX_FORKED, {"child": child.id, **details})
    child._guard.emit(EventType.SANDBOX_FORKED, {"parent": parent.id, **details})
    return child


def _fork_on_host(parent: Sandbox, lifetime: float) -> Sandbox:
    """The fast path: the child's workspace is a copy-on-write snapshot of the parent's.

    The backend freezes the parent for the instant of the snapshot, so the
    child starts with exactly the parent's files at that instant; no byte
    moves, whatever the workspace's size.
    """
    backend, handle = parent.backend, parent.handle
    token = PROVISION.set(lambda config: backend.create_fork(handle, config))
    try:
        child = _create_like(parent, lifetime)
    finally:
        PROVISION.reset(token)
    for secret in parent._guard.secrets:
        child._guard.add_secret(secret)  # as the channel path: the files may hold them
    details = {"copy": "snapshot", "skipped": []}
    parent._guard.emit(EventType.SANDBOX_FORKED, {"child": child.id, **details})
    child._guard.emit(EventType.SANDBOX_FORKED, {"parent": parent.id, **details})
    return child


def _create_like(parent: Sandbox, lifetime: float) -> Sandbox:
    """A new sandbox with the parent's configuration, backend and hooks."""
    config = parent.config
    guard = parent._guard
    limits = config.limits
    return type(parent)(
        config.image,
        lifetime,
        environment=dict(config.environment),
        workdir=config.workdir,
        network_enabled=config.network != guard.policy.network,
        memory=limits.memory,
        cpus=limits.cpus,
        pids=limits.pids,
        gpus=limits.gpus,
        workspace_size=limits.workspace,
        workspace=limits.workspace_medium,
        scratch_size=limits.scratch,
        backend=parent.backend,
        read_only_root=config.read_only_root,
        security_policy=guard.policy,
        observers=guard.observers,
        approval_hook=guard.approval_hook,
    )
