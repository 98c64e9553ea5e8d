"""The backend contract.

A backend makes an isolated environment with the agent running in it, hands
back a byte stream to that agent, and destroys the environment.  Everything
else (commands, files, timeouts) is the channel's job, shared by all
backends.  One backend instance serves many sandboxes through handles.

Example::

    backend = get_backend("docker")
    handle = backend.create(config)
    stream = backend.open_channel(handle)      # agent waits for its bundle
    ...
    backend.destroy(handle)                    # idempotent
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Collection
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..channel.streams import ByteStream
from ..config import SandboxConfig
from ..errors import UnsupportedCapabilityError


class Capability(str, enum.Enum):
    """What a backend can do or enforce, declared as data.

    The guard checks these before an operation and raises
    :class:`~agentnest.errors.UnsupportedCapabilityError` when one is missing,
    so a backend that cannot enforce a policy never silently ignores it.
    """

    NETWORK_DENIED = "network.denied"
    """Can run with no network but loopback."""
    NETWORK_OPEN = "network.open"
    """Can give unfiltered network access."""
    EGRESS_DOMAINS = "network.allowlist"
    """Can restrict egress to allowlisted domains through the proxy."""
    RESOURCE_LIMITS = "limits"
    """Enforces memory, CPU and PID limits."""
    READ_ONLY_ROOT = "read-only-root"
    """Can mount the root filesystem read-only."""
    DEADLINE = "deadline"
    """Stops the sandbox at its deadline even if the host process died."""
    GPU = "gpu"
    """Can pass GPUs through."""
    EXTEND = "extend"
    """Can move a running sandbox's deadline (``Sandbox.extend``)."""
    FORK = "fork"
    SNAPSHOT = "snapshot"
    PAUSE = "pause"
    """Can stop every process of a sandbox and continue them later (``Sandbox.pause``/``resume``).

    .. versionadded:: 0.4.0"""
    LIVE_FORK = "fork.live"
    """Can fork a running sandbox with its processes (``Sandbox.fork(live=True)``: gVisor checkpoints).

    .. versionadded:: 0.4.0"""
    WARM_FORK = "fork.warm"
    """Can keep a started container ready to become a fork's child (:meth:`RuntimeBackend.create_spare`,
    :meth:`RuntimeBackend.claim_spare`): a fork then costs a workspace snapshot, not a container start.

    .. versionadded:: 0.4.0"""
    DISK_WORKSPACE = "workspace.disk"
    """Can give a sandbox a disk-backed, kernel-bounded, copy-on-write workspace
    (``workspace="disk"``: the storage pool, :mod:`agentnest.runtime.storage`).

    .. versionadded:: 0.4.0"""
    SECURITY_PROFILES = "security-profiles"
    """Applies a policy's own seccomp or AppArmor profile (and refuses one it cannot).

    .. versionadded:: 0.4.0"""
    ROOTLESS = "rootless"
    """Can tell whether its engine is rootless, for ``SecurityPolicy(rootless=True)``.

    .. versionadded:: 0.4.0"""


@dataclass
class SandboxHandle:
    """A backend's reference to one sandbox.  Opaque to everyone else."""

    id: str
    """AgentNest's id for the sandbox (also in labels)."""
    backend: str
    """The name of the backend that created it."""
    deadline: float
    """Wall-clock time (epoch seconds) when the sandbox stops itself."""
    info: dict[str, Any] = field(default_factory=dict)
    """Backend-private details (container id, ...)."""


class RuntimeBackend(ABC):
    """Where sandboxes live.  Subclass it to add a backend.

    Third-party backends register a factory in the ``agentnest.backends``
    entry-point group; :func:`agentnest.runtime.registry.get_backend` finds
    them by name.
    """

    name: str = "abstract"

    def capabilities(self) -> frozenset[Capability]:
        """What this backend can do and enforce."""
        return frozenset()

    @property
    def oci_runtime(self) -> str | None:
        """The OCI runtime its sandboxes run under (``runc``, ``runsc``...); None if it cannot say.

        ``SecurityPolicy.required_runtime`` is checked against it: a backend
        that cannot say is refused whenever a policy requires a runtime.
        """
        return None

    @abstractmethod
    def create(self, config: SandboxConfig) -> SandboxHandle:
        """Create and start a sandbox whose agent waits for its bundle.

        Raises:
            BackendError: the engine failed.
            ImageNotFoundError: the image is missing and cannot be pulled.
            UnsupportedCapabilityError: the config asks for what cannot be enforced.
        """

    @abstractmethod
    def open_channel(self, handle: SandboxHandle) -> ByteStream:
        """Return a byte stream to a freshly started agent in the sandbox.

        The first call returns the agent started with the sandbox; later
        calls (after an agent died) start a new agent.
        """

    @abstractmethod
    def destroy(self, handle: SandboxHandle) -> None:
        """Remove the sandbox and everything it owns.  Idempotent."""

    def is_running(self, handle: SandboxHandle) -> bool:
        """Whether the sandbox still exists and runs (best effort)."""
        return True

    def extend(self, handle: SandboxHandle, deadline: float) -> None:
        """Move the sandbox's deadline to ``deadline`` (epoch seconds) where its own
        timer and ``prune`` both read it.

        Raises:
            UnsupportedCapabilityError: the backend cannot (the default).
        """
        raise UnsupportedCapabilityError(f"the {self.name} backend cannot move a sandbox's deadline")

    def exit_reason(self, handle: SandboxHandle) -> str | None:
        """Why a sandbox that is no longer running stopped, if known."""
        return None

    # -- host-side workspace (the fast paths; every method has a channel fallback) --

    def workspace_path(
        self, handle: SandboxHandle, *, write: bool = False, complete: bool = False
    ) -> Path | None:
        """The live workspace's directory on this host, or ``None`` (the default).

        With ``write``, only if what the host writes there (files, and
        directories it renames: a restore's swap) is what the sandbox then
        sees, not so where the sandbox's kernel would keep a stale view of
        the directory tree.  With ``complete``, only if every entry the
        sandbox sees is there (not so where FIFOs and sockets made inside live
        in the sandbox's own kernel, as gVisor's do): then a name the host
        cannot find is not in the sandbox either.

        Only a backend whose workspace this process can reach directly (a
        local storage pool) returns one; callers then read, write, snapshot
        and fork from the host side instead of through the agent channel.
        Its contents are the sandbox's: untrusted, and changing under the
        caller unless the sandbox is frozen (:meth:`frozen`).
        """
        return None

    def workspace_quota(self, handle: SandboxHandle) -> int | None:
        """The size the kernel holds a disk workspace to, read on the host; ``None`` if none.

        For ``verify=True`` and ``agentnest doctor``: inside the sandbox a quota
        is invisible (``statfs`` shows the whole pool).
        """
        return None

    def workspace_usage(self, handle: SandboxHandle) -> int | None:
        """Bytes a disk workspace held at the storage's last commit, read on the host; ``None`` if unknown.

        Data written since the last commit may be missing: an estimate, for
        choosing how to copy the workspace (see ``state.programs.LIVE_READ_MAX``).
        """
        return None

    def frozen(self, handle: SandboxHandle) -> AbstractContextManager[None]:
        """Stop every process of the sandbox for the duration of the ``with``.

        For a consistent copy of the workspace; the default does nothing
        (for backends without :meth:`workspace_path`).
        """
        return nullcontext()

    def frozen_workspace(self, handle: SandboxHandle) -> AbstractContextManager[Path]:
        """A read-only copy of the workspace at this instant, on this host, for the ``with``.

        Raises:
            UnsupportedCapabilityError: no host-side workspace (the default).
        """
        raise UnsupportedCapabilityError(f"the {self.name} backend has no host-side workspace")

    def create_fork(self, parent: SandboxHandle, config: SandboxConfig) -> SandboxHandle:
        """Like :meth:`create`, with the workspace a copy-on-write copy of ``parent``'s.

        The parent is frozen for the instant of the copy.  Only for a parent
        with a :meth:`workspace_path`.

        Raises:
            UnsupportedCapabilityError: the backend cannot (the default).
        """
        raise UnsupportedCapabilityError(f"the {self.name} backend cannot copy a workspace on the host")

    def create_spare(self, config: SandboxConfig) -> SandboxHandle:
        """A started sandbox of ``config`` with no workspace yet, to become a fork's child later.

        Its agent waits for its bundle, as after :meth:`create`; its deadline
        is provisional until :meth:`claim_spare`.  Destroy it with
        :meth:`destroy` if it is never claimed.

        Raises:
            UnsupportedCapabilityError: the backend cannot (the default; see ``Capability.WARM_FORK``).
        """
        raise UnsupportedCapabilityError(f"the {self.name} backend keeps no warm containers for forks")

    def claim_spare(self, spare: SandboxHandle, parent: SandboxHandle, config: SandboxConfig) -> None:
        """Make ``spare`` (from :meth:`create_spare`) the child of a fork of ``parent``.

        Its workspace becomes a copy-on-write copy of ``parent``'s, taken with
        the parent frozen for the instant, and its deadline ``config.lifetime``
        from now.  If this raises, the spare is unusable: destroy it.

        Raises:
            UnsupportedCapabilityError: the backend cannot (the default).
            BackendError: the copy or the mount failed.
        """
        raise UnsupportedCapabilityError(f"the {self.name} backend keeps no warm containers for forks")

    def pause(self, handle: SandboxHandle) -> str:
        """Stop every process of the sandbox until :meth:`resume` (``Capability.PAUSE``).

        Idempotent.  Must cooperate with :meth:`frozen`: a fork's unfreeze
        does not undo a pause.  Returns how: ``"freezer"`` (memory kept) or
        ``"checkpoint"`` (to disk, memory released; the agent's stream
        breaks and :meth:`resume` hands out a new one).

        Raises:
            UnsupportedCapabilityError: the backend cannot (the default).
        """
        raise UnsupportedCapabilityError(
            f"the {self.name} backend cannot pause a sandbox; use the docker or gvisor backend, "
            "or destroy the sandbox and snapshot() it first to keep its files"
        )

    def resume(self, handle: SandboxHandle) -> bool:
        """Continue a sandbox stopped by :meth:`pause`.  Idempotent.

        Returns whether the agent must be reconnected: then :meth:`open_channel`
        returns a stream to the restored agent, which waits for a
        ``reconnect`` frame (not the bundle).

        Raises:
            SnapshotError: a checkpoint could not be restored (the sandbox stays paused).
            UnsupportedCapabilityError: the backend cannot (the default).
        """
        raise UnsupportedCapabilityError(f"the {self.name} backend cannot pause or resume a sandbox")

    def attach_paused(self, sandbox_id: str) -> tuple[SandboxHandle, SandboxConfig]:
        """A sandbox another process paused to disk (:meth:`pause` returned ``"checkpoint"``), to resume here.

        Returns its handle, still paused (:meth:`resume` restores it, and its
        agent then waits for a ``reconnect`` frame, ids after
        ``info["reconnect_ids"]``), and its configuration.  This process owns
        it from now on.

        Raises:
            UnsupportedCapabilityError: the backend cannot (the default).
            SandboxDestroyedError: no such paused sandbox, or its deadline passed.
            SnapshotError: its record is corrupt or from another version.
        """
        raise UnsupportedCapabilityError(f"the {self.name} backend does not pause sandboxes to disk")

    def create_live_fork(self, parent: SandboxHandle, config: SandboxConfig) -> SandboxHandle:
        """Like :meth:`create_fork`, with the parent's processes too (``Capability.LIVE_FORK``).

        The child's agent is the parent's, restored: its stream waits for a
        ``reconnect`` frame (``info["reconnect_ids"]``), and so does the
        parent's new one (``info["stream"]`` of the parent).

        Raises:
            UnsupportedCapabilityError: the backend cannot (the default).
        """
        raise UnsupportedCapabilityError(
            f"the {self.name} backend cannot fork running processes; use fork(live=False)"
        )

    def logs(self, handle: SandboxHandle, tail: int = 200) -> str:
        """The sandbox's own log (bounded), if the backend keeps one."""
        return ""

    def ping(self) -> None:  # noqa: B027 - optional hook: a backend with nothing to reach is always ready
        """Check that the backend's engine or cluster answers now (a readiness probe).

        Raises:
            RuntimeNotAvailableError: it does not, with the reason.

        .. versionadded:: 0.4.0
        """

    def capacity(self) -> tuple[int | None, float | None]:
        """Memory (bytes) and CPUs all of this backend's sandboxes may hold together, as far as the
        backend knows (``None`` for what it cannot tell).  The manager admits within it.

        .. versionadded:: 0.4.0
        """
        return None, None

    def reclaim(self, owners: Collection[str]) -> int:
        """Remove the sandboxes whose owning process (``host:pid``, the ``owner`` of
        :mod:`agentnest.runtime.owner`) is one of ``owners`` and is gone; the number removed.

        The manager calls it for servers that stopped answering.  By default nothing
        is removed here: each sandbox still stops at its own deadline.

        .. versionadded:: 0.4.0
        """
        return 0

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release client resources (connections).  Sandboxes are not touched."""


class HostTarget(Protocol):
    """What the host's own file path (:mod:`.hostfs`) needs of a sandbox: backend, handle, configuration."""

    @property
    def backend(self) -> RuntimeBackend: ...
    @property
    def handle(self) -> SandboxHandle: ...
    @property
    def config(self) -> SandboxConfig: ...
