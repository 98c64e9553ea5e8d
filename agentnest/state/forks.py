"""Fork: branch a sandbox into a new one with the same files.  See :meth:`Sandbox.fork`."""

from __future__ import annotations

import dataclasses
import logging
import tarfile
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING

from ..channel.client import Channel
from ..errors import BackendError, ChannelError, ConfigurationError, SnapshotError, UnsupportedCapabilityError
from ..events import EventType
from ..policy import NetworkMode
from ..runtime.base import Capability
from .archive import _Gate
from .host import _host_workspace, _start_extractor, _start_writer
from .programs import _read_program, _require, _writer_args
from .rules import TarRules
from .spares import SPARES

log = logging.getLogger("agentnest.fork")

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..approvals import ApprovalHook
    from ..config import SandboxConfig
    from ..events import Observer
    from ..policy import SecurityPolicy
    from ..runtime.base import RuntimeBackend, SandboxHandle
    from ..sandbox import Sandbox

#: How the sandbox being constructed in this context gets its handle (and,
#: for a warm spare, its already connected channel), when not from
#: ``backend.create``: set by a host-side fork around the child's constructor
#: (a context variable: invisible to other threads and tasks, and to the
#: public signature of ``Sandbox``).
PROVISION: ContextVar[Callable[[SandboxConfig], SandboxHandle | tuple[SandboxHandle, Channel]] | None] = (
    ContextVar("agentnest_provision", default=None)
)


def fork(parent: Sandbox, *, timeout: float | None = None, live: bool | None = None) -> Sandbox:
    """Branch ``parent`` into a new sandbox.  See :meth:`Sandbox.fork`."""
    parent._ch()  # raises SandboxDestroyedError for a destroyed parent
    _require(parent, Capability.FORK, "fork")
    if live is not None and not isinstance(live, bool):
        raise ConfigurationError(f"live={live!r} must be True, False or None (the backend's default)")
    config = parent.config
    guard = parent._guard
    lifetime = config.lifetime if timeout is None else timeout
    limits = config.limits
    can_live = (
        Capability.LIVE_FORK in parent.backend.capabilities()
        and config.network.mode is NetworkMode.DENIED
        and limits.workspace_medium == "disk"
    )
    if live and not can_live:
        if Capability.LIVE_FORK not in parent.backend.capabilities():
            why = (
                f"the {parent.backend.name} backend cannot carry running processes into a fork (runc: "
                "CRIU fails on this kernel; gVisor needs Docker's experimental mode: `make engine` sets it)"
            )
        else:
            why = "a live fork is only for network-denied sandboxes with a disk workspace for now"
        raise UnsupportedCapabilityError(f"{why}; use fork(live=False) to copy the files only")
    guard.approve("fork", {"image": config.image, "timeout": lifetime})
    if live:
        return _fork_live(parent, lifetime)
    if live is None and can_live:
        try:
            return _fork_live(parent, lifetime)
        except UnsupportedCapabilityError:
            pass  # refused before anything stopped (e.g. restored once already): the files, then
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
    moves, whatever the workspace's size.  The child's container is a warm
    spare when one is ready (see :mod:`.spares`), else a new one; either
    way a spare is then made ready for the next fork.
    """
    backend, handle = parent.backend, parent.handle
    child: Sandbox | None = None
    claimed = False  # the child is the spare (not one made after a failed claim)
    warm = SPARES.take(parent, dataclasses.replace(parent.config, lifetime=lifetime))
    if warm is not None:
        spare = warm

        def claim(config: SandboxConfig) -> tuple[SandboxHandle, Channel]:
            backend.claim_spare(spare.handle, handle, config)
            return spare.handle, spare.channel

        token = PROVISION.set(claim)
        try:
            child = _create_like(parent, lifetime)
            claimed = True
        except (BackendError, UnsupportedCapabilityError) as exc:
            # The spare could not take the copy (nothing of the parent's is
            # lost): make the child the ordinary way instead.
            log.info("warm fork of %s failed, creating the child from scratch: %s", parent.id, exc)
            spare.discard()
        except BaseException:
            spare.discard()
            raise
        finally:
            PROVISION.reset(token)
    if child is None:
        token = PROVISION.set(lambda config: backend.create_fork(handle, config))
        try:
            child = _create_like(parent, lifetime)
        finally:
            PROVISION.reset(token)
    SPARES.want(parent)
    for secret in parent._guard.secrets:
        child._guard.add_secret(secret)  # as the channel path: the files may hold them
    details = {"copy": "snapshot", "skipped": [], "warm": claimed}
    parent._guard.emit(EventType.SANDBOX_FORKED, {"child": child.id, **details})
    child._guard.emit(EventType.SANDBOX_FORKED, {"parent": parent.id, **details})
    return child


def _fork_live(parent: Sandbox, lifetime: float) -> Sandbox:
    """The child gets the parent's processes too: a gVisor checkpoint restored twice.

    The parent is checkpointed (stopped), its workspace cloned, the child's
    container started from a copy of the checkpoint and the parent from the
    checkpoint itself; both agents are the parent's, and both host sides
    reconnect (a ``reconnect`` frame; request ids continue above the
    parent's, so frames for the parent's old requests are dropped).  The
    parent's lock is held throughout: no other thread starts a new agent
    in it meanwhile.
    """
    backend, handle = parent.backend, parent.handle
    started = time.monotonic()
    with parent._lock:
        old = parent._channel
        if old is None or old.hello is None or not old.alive:
            raise ChannelError(f"sandbox {parent.id} has no live agent to fork; call any method and retry")
        handle.info["agent_pid"] = old.hello.pid
        handle.info["reconnect_ids"] = old.next_id()
        old.hold(True)
        token = PROVISION.set(lambda config: backend.create_live_fork(handle, config))
        try:
            child = _create_like(parent, lifetime)
        except (ChannelError, SnapshotError) as exc:
            # runsc refused the copy, or started it and its agent never
            # answered: the child could not be restored (and was destroyed).
            raise SnapshotError(
                f"the live fork of sandbox {parent.id} could not be restored in the child ({exc}); "
                "the parent is intact; retry, or use fork(live=False)",
                rule="checkpoint",
            ) from exc
        finally:
            PROVISION.reset(token)
            stream = handle.info.pop("stream", None)
            if stream is not None:
                # The parent was restored: its agent waits on a new stream.
                old.close("the sandbox was checkpointed for a live fork")
                parent._channel = None
                parent._channel = Channel.connect(stream, None, timeout=60.0, after=old)
            else:
                old.hold(False)
    for secret in parent._guard.secrets:
        child._guard.add_secret(secret)
    details = {"copy": "live", "skipped": [], "seconds": round(time.monotonic() - started, 4)}
    parent._guard.emit(EventType.SANDBOX_FORKED, {"child": child.id, **details})
    child._guard.emit(EventType.SANDBOX_FORKED, {"parent": parent.id, **details})
    return child


def _create_like(parent: Sandbox, lifetime: float) -> Sandbox:
    """A new sandbox with the parent's configuration, backend and hooks."""
    guard = parent._guard
    return sandbox_of(
        type(parent),
        parent.config,
        lifetime,
        backend=parent.backend,
        security_policy=guard.policy,
        observers=guard.observers,
        approval_hook=guard.approval_hook,
        network_enabled=parent.config.network != guard.policy.network,
    )


def sandbox_of(
    cls: type[Sandbox],
    config: SandboxConfig,
    lifetime: float,
    *,
    backend: RuntimeBackend,
    security_policy: SecurityPolicy | None,
    observers: Sequence[Observer],
    approval_hook: ApprovalHook | None,
    network_enabled: bool = False,
) -> Sandbox:
    """``cls(...)`` with what ``config`` says (under :data:`PROVISION`, the handle comes from there)."""
    limits = config.limits
    return cls(
        config.image,
        lifetime,
        environment=dict(config.environment),
        workdir=config.workdir,
        network_enabled=network_enabled,
        memory=limits.memory,
        cpus=limits.cpus,
        pids=limits.pids,
        gpus=limits.gpus,
        workspace_size=limits.workspace,
        workspace=limits.workspace_medium,
        scratch_size=limits.scratch,
        backend=backend,
        read_only_root=config.read_only_root,
        security_policy=security_policy,
        observers=observers,
        approval_hook=approval_hook,
    )
