"""The Kubernetes egress pieces that are pure logic: the proxy-log follower and the double's wiring.

The follower is fed by a scripted stand-in for ``KubeApi.log_lines`` (what
the apiserver sends, reconnects included); end to end it runs against the
double in tests/integration/test_k8s_egress.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from doubles.kube.node import link_name, pod_network

from agentnest.config import SandboxConfig
from agentnest.egress.proxy import EVENT_READY
from agentnest.errors import RuntimeNotAvailableError
from agentnest.policy import NetworkPolicy
from agentnest.runtime.egresslog import EgressLog
from agentnest.runtime.kubernetes import KubernetesSpec, manifests
from agentnest.runtime.kubernetes.egress import ProxyLogFollower, split_timestamp
from agentnest.testing.wait import wait_until


def event(host: str) -> bytes:
    return json.dumps(
        {
            "type": "egress.allowed",
            "host": host,
            "port": 443,
            "address": "203.0.113.7",
            "reason": "allowed",
            "detail": "",
            "method": "CONNECT",
            "bytes_up": 1,
            "bytes_down": 2,
            "duration": 0.5,
            "time": 1_800_000_000.0,
        }
    ).encode()


def test_timestamps_order_as_times_not_as_text() -> None:
    # The kubelet trims trailing zeros: as text, ".1234Z" sorts after ".12345Z".
    a = split_timestamp(b"2026-12-03T16:50:00.1234Z x")
    b = split_timestamp(b"2026-12-03T16:50:00.12345Z y")
    assert a is not None and b is not None
    assert a[0] < b[0] and (a[1], b[1]) == (b"x", b"y")
    whole = split_timestamp(b"2026-12-03T16:50:01Z z")
    assert whole is not None and whole[0] == ("2026-12-03T16:50:01", 0) and b[0] < whole[0]
    for bad in (b"no stamp", b"2026-12-03 16:50:00Z x", b"2026-12-03T16:50:00.1234567890Z x", b""):
        assert split_timestamp(bad) is None


class ScriptedApi:
    """``log_lines`` answers from a script: each follow yields its lines, then ends or fails."""

    def __init__(
        self, follows: list[tuple[list[bytes], BaseException | None]], pod_gone: bool = True
    ) -> None:
        self.follows = follows
        self.since: list[str | None] = []
        self.pod_gone = pod_gone
        self.done = threading.Event()

    def log_lines(self, pod: str, container: str, *, since_time: str | None, **_: Any) -> Iterator[bytes]:
        self.since.append(since_time)
        if not self.follows:
            self.done.set()
            return iter(())
        lines, error = self.follows.pop(0)

        def gen() -> Iterator[bytes]:
            yield from lines
            if error is not None:
                raise error

        return gen()

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        return None if self.pod_gone or not self.follows else {"status": {"phase": "Running"}}


def test_a_reconnect_resumes_from_the_last_line_taken_and_takes_none_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agentnest.runtime.kubernetes import egress as module

    monkeypatch.setattr(module, "RETRY_DELAY", 0.01)
    ready = json.dumps({"type": EVENT_READY, "listen": ["0.0.0.0", 3128]}).encode()
    first = [
        b"2026-12-03T16:50:00.5Z " + ready,
        b"2026-12-03T16:50:01.1Z " + event("a.example"),
        b"2026-12-03T16:50:01.2Z " + event("b.example"),
    ]
    # The server resends from the whole second (sinceTime has seconds): a.example and b.example again.
    second = [
        b"2026-12-03T16:50:01.1Z " + event("a.example"),
        b"2026-12-03T16:50:01.2Z " + event("b.example"),
        b"2026-12-03T16:50:01.25Z " + event("c.example"),
        b"not a timestamped line",
    ]
    api = ScriptedApi([(first, RuntimeNotAvailableError("read timed out")), (second, None)])
    log = EgressLog("sb1")
    follower = ProxyLogFollower(api, "agentnest-sb1-egress", log)
    follower.start()
    wait_until(log.closed.is_set, "the follower to end with its pod", 10)
    assert [e["host"] for e in log.log()] == ["a.example", "b.example", "c.example"]
    assert log.listen == ("0.0.0.0", 3128) and log.ready.is_set()
    assert api.since == [None, "2026-12-03T16:50:01Z"]
    assert log.invalid == 1  # the line without a timestamp
    assert "read timed out" in follower.last_error


def test_stop_ends_the_follower_without_waiting_for_the_pod() -> None:
    api = ScriptedApi([([], RuntimeNotAvailableError("silent"))] * 1000, pod_gone=False)
    log = EgressLog("sb2")
    follower = ProxyLogFollower(api, "p", log)
    follower.start()
    wait_until(lambda: len(api.since) >= 1, "a first follow", 10)
    follower.stop(wait=5)
    assert log.closed.is_set()


class UnreachableApi:
    """Every follow ends at once and the pod cannot be looked up: the follower waits to retry."""

    def __init__(self) -> None:
        self.asked = threading.Event()

    def log_lines(self, pod: str, container: str, **_: Any) -> Iterator[bytes]:
        return iter(())

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        self.asked.set()
        raise RuntimeNotAvailableError("apiserver unreachable")


def test_stop_cuts_short_the_wait_before_a_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentnest.runtime.kubernetes import egress as module

    monkeypatch.setattr(module, "RETRY_DELAY", 3600.0)  # a plain sleep would outlast the join below
    api = UnreachableApi()
    log = EgressLog("sb3")
    follower = ProxyLogFollower(api, "p", log)
    follower.start()
    assert api.asked.wait(10), "the follower never looked up its pod"
    follower.stop(wait=10)
    assert log.closed.is_set()  # the thread has ended (set on its way out)


# -- the double's network plugin --------------------------------------------------------


def _objects(network: NetworkPolicy) -> list[dict[str, Any]]:
    config = SandboxConfig(image="agentnest/base:1", network=network)
    spec = KubernetesSpec(namespace="ns", runtime_class_name=None)
    return manifests.render(config, spec, "abc123", now=1_800_000_000.0, command=["true"])


def _pods(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["labels"][manifests.ROLE]: o for o in objects if o["kind"] == "Pod"}


def test_the_double_links_a_sandbox_to_its_proxy_and_only_the_proxy_to_the_outside() -> None:
    objects = _objects(NetworkPolicy.allowlist(["example.com"]))
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    pods = _pods(objects)
    for pod in pods.values():
        pod["metadata"]["namespace"] = "ns"
    sandbox, proxy = pod_network(policies, pods["sandbox"]), pod_network(policies, pods["egress-proxy"])
    assert not sandbox.isolated and not sandbox.outside
    assert not proxy.isolated and proxy.outside
    assert sandbox.links == proxy.links and len(sandbox.links) == 1  # one shared link, nothing else
    # Another sandbox's proxy is on another link.
    other = [o for o in _objects(NetworkPolicy.allowlist(["example.com"])) if o["kind"] == "NetworkPolicy"]
    assert link_name("ns", {"matchLabels": {"x": "1"}}) != sandbox.links[0]
    assert pod_network(other, pods["sandbox"]).links == sandbox.links  # same id, same link


def test_the_double_isolates_a_denied_pod_and_leaves_an_unselected_one_alone() -> None:
    objects = _objects(NetworkPolicy.denied())
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    pod = _pods(objects)["sandbox"]
    pod["metadata"]["namespace"] = "ns"
    assert pod_network(policies, pod).isolated
    stranger = {"metadata": {"namespace": "ns", "labels": {"app": "other"}}}
    free = pod_network(policies, stranger)
    assert not free.isolated and free.outside and free.links == ()
