"""Fork: branch a sandbox into a new one with the same files.  See :meth:`Sandbox.fork`."""

from __future__ import annotations

import dataclasses
import logging
import tarfile
import time
from typing import TYPE_CHECKING

from .._core import Provision, SandboxCore, config_like
from ..channel.client import Channel
from ..errors import BackendError, ChannelError, ConfigurationError, SnapshotError, UnsupportedCapabilityError
from ..events import EventType
from ..policy import NetworkMode
from ..runtime.base import Capability
from ..runtime.hostfs import host_workspace as _host_workspace
from .archive import _Gate
from .host import _start_extractor, _start_writer
from .programs import _read_program, _require, _writer_args
from .rules import TarRules
from .spares import SPARES

if TYPE_CHECKING:
    from ..config import SandboxConfig
    from ..runtime.base import SandboxHandle

log = logging.getLogger("agentnest.fork")


def fork(parent: SandboxCore, *, timeout: float | None = None, live: bool | None = None) -> SandboxCore:
    """Branch ``parent`` into a new sandbox.  See :meth:`Sandbox.fork`."""
    parent.link()  # raises SandboxDestroyedError for a destroyed parent
    _require(parent, Capability.FORK, "fork")
    if live is not None and not isinstance(live, bool):
        raise ConfigurationError(f"live={live!r} must be True, False or None (the backend's default)")
    config = parent.config
    guard = parent.guard
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
            child.guard.add_secret(secret)
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
    child.guard.emit(EventType.SANDBOX_FORKED, {"parent": parent.id, **details})
    return child


def _fork_on_host(parent: SandboxCore, lifetime: float) -> SandboxCore:
    """The fast path: the child's workspace is a copy-on-write snapshot of the parent's.

    The backend freezes the parent for the instant of the snapshot, so the
    child starts with exactly the parent's files at that instant; no byte
    moves, whatever the workspace's size.  The child's container is a warm
    spare when one is ready (see :mod:`.spares`), else a new one; either
    way a spare is then made ready for the next fork.
    """
    backend, handle = parent.backend, parent.handle
    child: SandboxCore | None = None
    claimed = False  # the child is the spare (not one made after a failed claim)
    warm = SPARES.take(parent, dataclasses.replace(parent.config, lifetime=lifetime))
    if warm is not None:
        spare = warm

        def claim(config: SandboxConfig) -> tuple[SandboxHandle, Channel]:
            backend.claim_spare(spare.handle, handle, config)
            return spare.handle, spare.channel

        try:
            child = _create_like(parent, lifetime, claim)
            claimed = True
        except (BackendError, UnsupportedCapabilityError) as exc:
            # The spare could not take the copy (nothing of the parent's is
            # lost): make the child the ordinary way instead.
            log.info("warm fork of %s failed, creating the child from scratch: %s", parent.id, exc)
            spare.discard()
        except BaseException:
            spare.discard()
            raise
    if child is None:
        child = _create_like(parent, lifetime, lambda config: backend.create_fork(handle, config))
    SPARES.want(parent)
    for secret in parent.guard.secrets:
        child.guard.add_secret(secret)  # as the channel path: the files may hold them
    details = {"copy": "snapshot", "skipped": [], "warm": claimed}
    parent.guard.emit(EventType.SANDBOX_FORKED, {"child": child.id, **details})
    child.guard.emit(EventType.SANDBOX_FORKED, {"parent": parent.id, **details})
    return child


def _fork_live(parent: SandboxCore, lifetime: float) -> SandboxCore:
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
    with parent.lock:
        old = parent.channel
        if old is None or old.hello is None or not old.alive:
            raise ChannelError(f"sandbox {parent.id} has no live agent to fork; call any method and retry")
        handle.info["agent_pid"] = old.hello.pid
        handle.info["reconnect_ids"] = old.next_id()
        old.hold(True)
        try:
            child = _create_like(parent, lifetime, lambda config: backend.create_live_fork(handle, config))
        except (ChannelError, SnapshotError) as exc:
            # runsc refused the copy, or started it and its agent never
            # answered: the child could not be restored (and was destroyed).
            raise SnapshotError(
                f"the live fork of sandbox {parent.id} could not be restored in the child ({exc}); "
                "the parent is intact; retry, or use fork(live=False)",
                rule="checkpoint",
            ) from exc
        finally:
            stream = handle.info.pop("stream", None)
            if stream is not None:
                # The parent was restored: its agent waits on a new stream.
                old.close("the sandbox was checkpointed for a live fork")
                parent.channel = None
                parent.channel = Channel.connect(stream, None, timeout=60.0, after=old)
            else:
                old.hold(False)
    for secret in parent.guard.secrets:
        child.guard.add_secret(secret)
    details = {"copy": "live", "skipped": [], "seconds": round(time.monotonic() - started, 4)}
    parent.guard.emit(EventType.SANDBOX_FORKED, {"child": child.id, **details})
    child.guard.emit(EventType.SANDBOX_FORKED, {"parent": parent.id, **details})
    return child


def _create_like(parent: SandboxCore, lifetime: float, provision: Provision | None = None) -> SandboxCore:
    """A new sandbox with the parent's configuration, backend and hooks (its handle from ``provision``)."""
    guard = parent.guard
    config = config_like(parent.config, guard.policy, lifetime, parent.config.network)
    return SandboxCore(
        parent.backend, config, guard.policy, guard.observers, guard.approval_hook, provision=provision
    )
