"""What the cluster says, mapped to the one exception tree (pure; no cluster)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentnest.errors import (
    BackendError,
    ConfigurationError,
    ImageNotFoundError,
    RuntimeNotAvailableError,
    SandboxDestroyedError,
)
from agentnest.runtime.kubernetes.reasons import MAX_MESSAGE, api_error, parse_status, pod_verdict


def status(code: int, reason: str, message: str, **details: Any) -> bytes:
    doc: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        doc["details"] = details
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("code", "reason", "message", "details", "kind", "code_name", "says"),
    [
        (
            403,
            "Forbidden",
            'pod rejected: RuntimeClass "gvisor" not found',
            {},
            RuntimeNotAvailableError,
            "runtime_class",
            "runtime_class_name",
        ),
        (
            403,
            "Forbidden",
            'pods "agentnest-1" is forbidden: exceeded quota: compute, requested: limits.memory=512Mi, '
            "used: limits.memory=2Gi, limited: limits.memory=2Gi",
            {"name": "agentnest-1", "kind": "pods"},
            BackendError,
            "quota",
            "ResourceQuota",
        ),
        (
            403,
            "Forbidden",
            'pods "agentnest-1" is forbidden: violates PodSecurity "restricted:latest": '
            'allowPrivilegeEscalation != false (container "sandbox" must set allowPrivilegeEscalation=false)',
            {"name": "agentnest-1", "kind": "pods"},
            BackendError,
            "pod_security",
            "restricted",
        ),
        (
            403,
            "Forbidden",
            'pods is forbidden: User "alice" cannot create resource "pods" in API group "" '
            'in the namespace "agentnest"',
            {"kind": "pods"},
            RuntimeNotAvailableError,
            "rbac",
            "agentnest kubernetes setup",
        ),
        (401, "Unauthorized", "Unauthorized", {}, RuntimeNotAvailableError, "auth", "kubectl auth whoami"),
        (
            404,
            "NotFound",
            'namespaces "agentnest" not found',
            {"name": "agentnest", "kind": "namespaces"},
            RuntimeNotAvailableError,
            "namespace",
            "agentnest kubernetes setup",
        ),
        (409, "AlreadyExists", 'pods "agentnest-1" already exists', {}, BackendError, "conflict", "exists"),
        (429, "TooManyRequests", "too many requests", {}, BackendError, "throttled", "retry"),
        (
            500,
            "InternalError",
            "etcdserver: request timed out",
            {},
            RuntimeNotAvailableError,
            "apiserver",
            "HTTP 500",
        ),
    ],
)
def test_api_refusals_become_typed_errors_with_a_reason_and_a_fix(
    code: int, reason: str, message: str, details: dict[str, Any], kind: type, code_name: str, says: str
) -> None:
    err = api_error(
        code, status(code, reason, message, **details), action="create pod agentnest-1", namespace="agentnest"
    )
    assert type(err) is kind
    assert isinstance(err, BackendError)
    assert err.reason == code_name
    text = str(err)
    assert "create pod agentnest-1" in text and "'agentnest'" in text
    assert message[:40] in text
    assert says in text


def test_a_missing_pod_is_a_destroyed_sandbox() -> None:
    err = api_error(
        404,
        status(404, "NotFound", 'pods "agentnest-1" not found', kind="pods", name="agentnest-1"),
        action="exec",
    )
    assert isinstance(err, SandboxDestroyedError)


def test_an_invalid_object_lists_the_fields_the_apiserver_named() -> None:
    body = status(
        422,
        "Invalid",
        'Pod "agentnest-1" is invalid: spec.activeDeadlineSeconds: Invalid value: 100: '
        "must be less than or equal to previous value",
        kind="Pod",
        causes=[
            {
                "reason": "FieldValueInvalid",
                "field": "spec.activeDeadlineSeconds",
                "message": "Invalid value: 100: must be less than or equal to previous value",
            }
        ],
    )
    err = api_error(422, body, action="patch pod agentnest-1")
    assert isinstance(err, ConfigurationError)
    assert "spec.activeDeadlineSeconds: Invalid value: 100" in str(err)


def test_a_body_that_is_not_a_status_is_shown_cut_and_printable() -> None:
    err = api_error(502, b"<html>bad gateway\x1b[31m</html>", action="list pods")
    assert isinstance(err, RuntimeNotAvailableError)
    assert "bad gateway" in str(err) and "\x1b" not in str(err)
    huge = api_error(403, json.dumps({"message": "x" * 100_000}).encode(), action="create pod p")
    assert len(str(huge)) < MAX_MESSAGE + 400
    assert parse_status(b"[1, 2]") == {}
    assert parse_status(None) == {}
    assert parse_status(b"") == {}
    assert parse_status(b"a" * 200_000)["message"].endswith("...")


def pod(phase: str = "Pending", **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "agentnest-1"}, "status": {"phase": phase, **status}}


def waiting(reason: str, message: str = "") -> dict[str, Any]:
    return {
        "containerStatuses": [
            {
                "name": "sandbox",
                "image": "reg.example/app:1",
                "state": {"waiting": {"reason": reason, "message": message}},
            }
        ]
    }


def test_a_pending_pod_with_nothing_wrong_has_no_verdict() -> None:
    verdict = pod_verdict(pod("Pending"), [{"type": "Normal", "reason": "Scheduled", "message": "assigned"}])
    assert verdict.error is None and not verdict.final


def test_image_pull_back_off_is_an_image_not_found_error_at_once() -> None:
    verdict = pod_verdict(pod(**waiting("ImagePullBackOff", 'Back-off pulling image "reg.example/app:1"')))
    assert isinstance(verdict.error, ImageNotFoundError) and verdict.final
    assert "reg.example/app:1" in str(verdict.error) and "image_pull_secrets" in str(verdict.error)
    first = pod_verdict(pod(**waiting("ErrImagePull", "rpc error: not found")))
    assert isinstance(first.error, ImageNotFoundError) and not first.final


def test_a_node_without_the_runtime_handler_is_final() -> None:
    event = {
        "type": "Warning",
        "reason": "FailedCreatePodSandBox",
        "message": "Failed to create pod sandbox: rpc error: code = Unknown desc = "
        'failed to get sandbox runtime: no runtime for "runsc" is configured',
    }
    verdict = pod_verdict(pod(), [event])
    assert isinstance(verdict.error, RuntimeNotAvailableError) and verdict.final
    assert verdict.error.reason == "runtime_class" and "install gVisor" in str(verdict.error)


def test_failed_scheduling_is_the_reason_given_when_the_wait_runs_out() -> None:
    event = {
        "type": "Warning",
        "reason": "FailedScheduling",
        "message": "0/3 nodes are available: 3 Insufficient memory.",
    }
    verdict = pod_verdict(pod(), [{"type": "Normal", "reason": "Pulled"}, event])
    assert isinstance(verdict.error, BackendError) and not verdict.final
    assert verdict.error.reason == "capacity" and "Insufficient memory" in str(verdict.error)


@pytest.mark.parametrize(
    ("status_fields", "says"),
    [
        (
            {
                "reason": "DeadlineExceeded",
                "message": "Pod was active on the node longer than the specified deadline",
            },
            "deadline",
        ),
        (
            {"reason": "Evicted", "message": "The node was low on resource: ephemeral-storage."},
            "ephemeral-storage",
        ),
        (
            {
                "containerStatuses": [
                    {"name": "sandbox", "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}
                ]
            },
            "OOMKilled",
        ),
    ],
)
def test_an_ended_pod_is_a_destroyed_sandbox_saying_why(status_fields: dict[str, Any], says: str) -> None:
    verdict = pod_verdict(pod("Failed", **status_fields))
    assert isinstance(verdict.error, SandboxDestroyedError) and verdict.final
    assert says in str(verdict.error)


def test_container_errors_at_the_kubelet_are_final() -> None:
    config = pod_verdict(
        pod(**waiting("CreateContainerConfigError", "container has runAsNonRoot and image will run as root"))
    )
    assert isinstance(config.error, BackendError) and config.final and "runAsNonRoot" in str(config.error)
    seccomp = pod_verdict(pod(**waiting("CreateContainerError", "cannot load seccomp profile")))
    assert isinstance(seccomp.error, RuntimeNotAvailableError) and seccomp.final


def test_garbage_in_the_pod_status_is_no_verdict_and_no_exception() -> None:
    junk: Any
    for junk in (
        {},
        {"status": []},
        {"status": {"containerStatuses": "x"}},
        {"metadata": 3, "status": {"phase": 7}},
    ):
        assert pod_verdict(junk, [None, "x", {"type": "Warning"}]).error is None  # type: ignore[list-item]
