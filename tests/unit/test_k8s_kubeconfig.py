"""Loading the cluster's address and credentials: kubeconfig files, contexts, errors that say how to fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("kubernetes")

from agentnest.errors import ConfigurationError, RuntimeNotAvailableError
from agentnest.runtime.kubernetes.kubeconfig import load

GOOD = """\
apiVersion: v1
kind: Config
clusters:
- name: c1
  cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}
- name: c2
  cluster: {server: "https://127.0.0.2:7443", insecure-skip-tls-verify: true}
users:
- name: u1
  user: {token: token-one}
contexts:
- name: one
  context: {cluster: c1, user: u1, namespace: team-a}
- name: two
  context: {cluster: c2, user: u1}
current-context: one
"""


@pytest.fixture
def good(tmp_path: Path) -> Path:
    path = tmp_path / "config"
    path.write_text(GOOD)
    return path


def test_the_current_context_gives_server_token_and_namespace(good: Path) -> None:
    cluster = load(good)
    assert cluster.host == "https://127.0.0.1:6443"
    assert cluster.context == "one" and cluster.namespace == "team-a"
    assert cluster.configuration.get_api_key_with_prefix("BearerToken") == "Bearer token-one"
    assert str(good) in cluster.source


def test_another_context_by_name(good: Path) -> None:
    cluster = load(good, context="two")
    assert cluster.host == "https://127.0.0.2:7443" and cluster.namespace is None


def test_a_context_that_does_not_exist_lists_the_ones_that_do(good: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"no context 'three' \(it has: one, two\)"):
        load(good, context="three")


def test_no_current_context_asks_for_one(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(GOOD.replace("current-context: one\n", ""))
    with pytest.raises(ConfigurationError, match=r"no current context.*it has: one, two"):
        load(path)
    assert load(path, context="two").context == "two"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("clusters: [\n", "not valid YAML"),
        ("- just\n- a list\n", "not a kubeconfig"),
        ("contexts: 3\n", "'contexts' is not a list"),
        ("", "is empty"),
    ],
)
def test_a_malformed_kubeconfig_is_a_configuration_error(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "config"
    path.write_text(text)
    with pytest.raises(ConfigurationError, match=says):
        load(path)


def test_a_context_pointing_at_a_missing_cluster_is_a_configuration_error(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(GOOD.replace("{cluster: c1, user: u1", "{cluster: nowhere, user: u1"))
    with pytest.raises(ConfigurationError, match="context 'one'"):
        load(path)


def test_a_list_of_files_is_merged_and_empty_ones_skipped(good: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("")
    assert load(f"{empty}{os.pathsep}{good}").context == "one"


def test_no_kubeconfig_anywhere_names_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nope"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(RuntimeNotAvailableError, match=r"no kubeconfig was found \(looked at .*nope\)"):
        load()


def test_an_explicit_path_that_does_not_exist_is_a_configuration_error(good: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="does not exist"):
        load(f"{good}{os.pathsep}{tmp_path / 'missing'}")


def test_in_cluster_refuses_a_context(good: Path) -> None:
    with pytest.raises(ConfigurationError, match="in-cluster configuration has no contexts"):
        load(in_cluster=True, context="one")


def test_in_cluster_outside_a_pod_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(
        RuntimeNotAvailableError, match="in-cluster Kubernetes configuration could not be loaded"
    ):
        load(in_cluster=True)


def test_a_script_named_kubernetes_py_is_told_it_shadows_the_package(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = tmp_path / "kubernetes.py"
    script.write_text(
        "from agentnest.runtime.kubernetes.kubeconfig import load\n"
        "from agentnest.errors import MissingDependencyError\n"
        "try:\n    load()\nexcept MissingDependencyError as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert f"{script} shadows the kubernetes package" in out.stdout, out.stderr
