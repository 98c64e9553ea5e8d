"""``KubernetesSpec``: defaults, 0.3.0's names, and a clear error for every bad value."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import Any

import pytest

from agentnest.errors import ConfigurationError
from agentnest.runtime.kubernetes import KubernetesSpec


def test_defaults() -> None:
    spec = KubernetesSpec()
    assert spec.type == "kubernetes"
    assert spec.namespace == "agentnest"
    assert spec.context is None and spec.kubeconfig is None
    assert spec.runtime_class_name == "gvisor"
    assert spec.image_pull_policy == "IfNotPresent"
    assert spec.seccomp_profile() == {"type": "RuntimeDefault"}
    assert spec.host_users is False
    assert spec.workspace_storage_class is None
    assert spec.python == "python3"


def test_accepts_the_0_3_0_names() -> None:
    # KubernetesRuntime(namespace=, context=, runtime_class_name=) in 0.3.0.
    spec = KubernetesSpec(namespace="default", context="kind-kind", runtime_class_name=None)
    assert (spec.namespace, spec.context, spec.runtime_class_name) == ("default", "kind-kind", None)


def test_frozen_hashable_and_collections_frozen() -> None:
    spec = KubernetesSpec(
        node_selector={"sandbox": "gvisor"},
        # Lists, as users write them, are accepted and frozen into tuples.
        tolerations=[{"key": "sandbox", "operator": "Equal", "value": "gvisor", "effect": "NoSchedule"}],  # type: ignore[arg-type]
        image_pull_secrets=["regcred"],  # type: ignore[arg-type]
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.namespace = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.node_selector["x"] = "y"  # type: ignore[index]
    with pytest.raises(TypeError):
        spec.tolerations[0]["key"] = "x"  # type: ignore[index]
    assert spec.image_pull_secrets == ("regcred",)
    assert hash(spec) == hash(dataclasses.replace(spec))
    assert spec == dataclasses.replace(spec)


def test_localhost_seccomp() -> None:
    spec = KubernetesSpec(seccomp="Localhost:profiles/agentnest.json")
    assert spec.seccomp_profile() == {"type": "Localhost", "localhostProfile": "profiles/agentnest.json"}


BAD: list[tuple[dict[str, Any], str]] = [
    ({"type": "docker"}, "type='docker'"),
    ({"namespace": "Agent_Nest"}, "namespace='Agent_Nest'"),
    ({"namespace": "x" * 64}, "namespace="),
    ({"namespace": ""}, "namespace=''"),
    ({"context": ""}, "context=''"),
    ({"kubeconfig": 3}, "kubeconfig=3"),
    ({"runtime_class_name": "gVisor"}, "runtime_class_name='gVisor'"),
    ({"proxy_runtime_class_name": "a b"}, "proxy_runtime_class_name='a b'"),
    ({"image_pull_policy": "always"}, "image_pull_policy='always'"),
    ({"image_pull_secrets": "regcred"}, "image_pull_secrets='regcred'"),
    ({"image_pull_secrets": ["Reg_Cred"]}, "image_pull_secrets entry='Reg_Cred'"),
    ({"node_selector": ["a"]}, "node_selector=['a']"),
    ({"node_selector": {"a": "b c"}}, "node_selector: label a='b c'"),
    ({"node_selector": {"-bad": "x"}}, "label key '-bad'"),
    ({"tolerations": {"key": "a"}}, "tolerations="),
    ({"tolerations": ["a"]}, "tolerations[0]='a'"),
    ({"tolerations": [{"key": "a", "colour": "red"}]}, "unknown fields ['colour']"),
    ({"tolerations": [{"key": "a", "operator": "Maybe"}]}, "operator='Maybe'"),
    ({"tolerations": [{"key": "a", "operator": "Exists", "value": "v"}]}, "takes no value"),
    ({"tolerations": [{"value": "v"}]}, "empty key needs operator 'Exists'"),
    ({"tolerations": [{"key": "a", "effect": "NoRun"}]}, "effect='NoRun'"),
    ({"tolerations": [{"key": "a", "tolerationSeconds": "5"}]}, "tolerationSeconds='5'"),
    ({"tolerations": [{"key": 5}]}, "tolerations[0].key=5"),
    ({"priority_class_name": "High"}, "priority_class_name='High'"),
    ({"service_account_name": "a/b"}, "service_account_name='a/b'"),
    ({"seccomp": "Unconfined"}, "seccomp='Unconfined'"),
    ({"seccomp": "Localhost:"}, "seccomp='Localhost:'"),
    ({"seccomp": "Localhost:/etc/x.json"}, "seccomp='Localhost:/etc/x.json'"),
    ({"seccomp": "Localhost:../x.json"}, "seccomp='Localhost:../x.json'"),
    ({"host_users": "no"}, "host_users='no'"),
    ({"workspace_storage_class": "Fast SSD"}, "workspace_storage_class='Fast SSD'"),
    ({"python": "python 3"}, "python='python 3'"),
    ({"proxy_image": "a b"}, "proxy_image='a b'"),
]


@pytest.mark.parametrize(("kwargs", "needle"), BAD, ids=[repr(k)[:50] for k, _ in BAD])
def test_bad_values_name_field_value_and_fix(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        KubernetesSpec(**kwargs)
    message = str(info.value)
    assert needle in message
    # Every message says what to do: "use ...", or the fix inline.
    assert any(word in message for word in ("use", "must", "drop", "add")), message


def test_import_is_light() -> None:
    code = (
        "import sys\n"
        "import agentnest.runtime.kubernetes, agentnest.runtime.kubernetes.manifests\n"
        "import agentnest.runtime.kubernetes.lint\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'websockets', 'yaml')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"
