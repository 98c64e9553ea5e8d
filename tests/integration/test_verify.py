"""Fail-closed start on the real engine: verify=True checks the policy from inside."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from agentnest import MemoryObserver, Sandbox, SecurityPolicy, VerificationError
from agentnest.config import SandboxConfig
from agentnest.runtime.base import SandboxHandle
from agentnest.runtime.docker import DockerBackend
from agentnest.runtime.registry import get_backend

from .helpers import owned_containers


def root_mount_options(sb: Sandbox) -> list[str]:
    code = "print([l.split()[3] for l in open('/proc/self/mounts') if l.split()[1] == '/'][0])"
    return str(sb.exec_python(code).stdout).strip().split(",")


class WritableRoot(DockerBackend):
    """A backend with a bug: it does not apply the read-only root it was asked for."""

    def create(self, config: SandboxConfig) -> SandboxHandle:
        return super().create(dataclasses.replace(config, read_only_root=False))


def test_a_sandbox_that_holds_its_policy_is_handed_out(backend_name: str) -> None:
    obs = MemoryObserver()
    with Sandbox(backend=backend_name, verify=True, observers=[obs]) as sb:
        assert sb.exec_shell("echo ok").stdout == "ok\n"
    (verified,) = [e for e in obs.events if e.type.value == "sandbox.verified"]
    assert verified.data["ok"] is True
    checks = verified.data["checks"]
    assert checks["non-root user"] == checks["no capabilities"] == checks["read-only root"] == "ok"
    assert checks["no network"] == checks["workspace size"] == "ok"
    assert set(checks.values()) <= {"ok", "skip"}
    if backend_name == "docker":  # gVisor hides some of these: skip, never a silent ok
        assert set(checks.values()) == {"ok"}


def test_a_sandbox_that_breaks_its_policy_is_destroyed_not_handed_out(
    backend_name: str, docker_client: Any
) -> None:
    spec = get_backend(backend_name).spec  # type: ignore[attr-defined]
    broken = WritableRoot(spec, name=backend_name)
    before = owned_containers(docker_client)
    with pytest.raises(VerificationError, match="read-only root") as info:
        Sandbox(backend=broken, verify=True)
    assert [f.name for f in info.value.findings if f.status == "fail"] == ["read-only root"]
    assert owned_containers(docker_client) == before  # destroyed, nothing left behind
    # Without verify the same bug goes unnoticed: that is what verify is for.
    with Sandbox(backend=broken) as sb:
        assert root_mount_options(sb)[0] == "rw"


def test_a_writable_root_that_was_asked_for_passes(backend_name: str) -> None:
    policy = SecurityPolicy(read_only_root=False)
    with Sandbox(backend=backend_name, verify=True, read_only_root=False, security_policy=policy) as sb:
        assert root_mount_options(sb)[0] == "rw"
