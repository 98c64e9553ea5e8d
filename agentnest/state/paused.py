"""Resuming a sandbox another process paused to disk: see :meth:`Sandbox.from_checkpoint`."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._core import SandboxCore, config_like
from ..errors import ConfigurationError
from ..policy import SecurityPolicy
from ..runtime.registry import get_backend

if TYPE_CHECKING:
    from ..approvals import ApprovalHook
    from ..config import SandboxConfig
    from ..events import Observer
    from ..runtime.base import RuntimeBackend, SandboxHandle


def from_checkpoint(
    sandbox_id: str,
    backend: str | RuntimeBackend,
    security_policy: SecurityPolicy | None,
    observers: Sequence[Observer],
    approval_hook: ApprovalHook | None,
) -> SandboxCore:
    """Restore sandbox ``sandbox_id`` from its pause checkpoint into a new core."""
    runtime = get_backend(backend) if isinstance(backend, str) else backend
    handle, recorded = runtime.attach_paused(sandbox_id)
    if security_policy is not None and security_policy.network != recorded.network:
        raise ConfigurationError(
            f"sandbox {sandbox_id} has network {recorded.network.mode.value!r}; a policy with another "
            "network cannot resume it (leave the policy's network as it is)"
        )

    def provision(asked: SandboxConfig) -> SandboxHandle:
        # The sandbox is what it was: the caller's policy may judge it, not change it.
        same = dataclasses.replace(asked, lifetime=recorded.lifetime, proxy_image=recorded.proxy_image)
        if same != recorded:
            raise ConfigurationError(
                f"the security policy would change sandbox {sandbox_id} (its seccomp or AppArmor profile, "
                "or rootless); resume it under the policy it was created with"
            )
        runtime.resume(handle)  # SnapshotError: it stays paused, and resumable
        handle.info["attached"] = True
        return handle

    policy = security_policy or SecurityPolicy()
    config = config_like(recorded, policy, max(1.0, handle.deadline - time.time()), policy.network)
    return SandboxCore(runtime, config, policy, observers, approval_hook, provision=provision)
