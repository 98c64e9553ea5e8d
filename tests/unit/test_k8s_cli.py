"""``agentnest kubernetes manifest`` and ``setup --dry-run``, through ``main(argv)``.

The live ``setup`` is in test_k8s_setup.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentnest.cli import main
from agentnest.cli.kubernetes import dump
from agentnest.runtime.kubernetes.lint import lint

IMAGE = ["--image", "python:3.12-slim"]


def _json_stream(text: str) -> list[dict[str, Any]]:
    decoder = json.JSONDecoder()
    out, pos = [], 0
    while pos < len(text.rstrip()):
        obj, end = decoder.raw_decode(text, pos)
        out.append(obj)
        pos = end + 1
    return out


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_manifest_default_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "kubernetes", "manifest", *IMAGE, "--sandbox-id", "abc")
    assert code == 0, err
    assert out.startswith("---\n")
    objects = list(yaml.safe_load_all(out))
    assert [o["kind"] for o in objects] == ["NetworkPolicy", "Pod"]
    pod = objects[1]
    assert pod["metadata"]["name"] == "agentnest-abc"
    assert pod["metadata"]["namespace"] == "agentnest"
    assert pod["spec"]["runtimeClassName"] == "gvisor"
    assert pod["spec"]["containers"][0]["command"][4] == "listen"
    assert err == ""  # nothing to warn about


def test_manifest_allowlist_json_with_secret(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys,
        "kubernetes",
        "manifest",
        *IMAGE,
        "--allow-domain",
        "pypi.org",
        "--secret",
        "API_TOKEN",
        "--env",
        "MODE=ci",
        "--namespace",
        "sandboxes",
        "--memory",
        "1g",
        "--cpus",
        "0.5",
        "-o",
        "json",
    )
    assert code == 0, err
    objects = _json_stream(out)
    assert [o["kind"] for o in objects] == ["NetworkPolicy", "Pod", "NetworkPolicy", "Secret", "Pod"]
    assert {o["metadata"]["namespace"] for o in objects} == {"sandboxes"}
    secret = objects[3]
    assert secret["stringData"] == {"API_TOKEN": "<redacted>"}
    assert "agentnest-preview-secret" not in out
    limits = objects[4]["spec"]["containers"][0]["resources"]["limits"]
    assert (limits["memory"], limits["cpu"]) == ("1Gi", "500m")
    assert all(lint(o) == [] for o in objects)


def test_manifest_open_and_options(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "kubernetes",
        "manifest",
        *IMAGE,
        "--network",
        "open",
        "--runtime-class",
        "none",
        "--storage-class",
        "fast",
        "--workspace-size",
        "5g",
        "--seccomp",
        "Localhost:agentnest.json",
        "-o",
        "json",
    )
    assert code == 0
    (pod,) = _json_stream(out)
    assert "runtimeClassName" not in pod["spec"]
    (workspace,) = [v for v in pod["spec"]["volumes"] if v["name"] == "workspace"]
    assert workspace["ephemeral"]["volumeClaimTemplate"]["spec"]["storageClassName"] == "fast"
    assert pod["spec"]["securityContext"]["seccompProfile"]["localhostProfile"] == "agentnest.json"


def test_manifest_from_profile(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "agentnest.yaml"
    path.write_text(
        "profiles:\n"
        "  net:\n"
        "    image: python:3.11-slim\n"
        "    memory: 768m\n"
        "    network:\n"
        "      allowlist:\n"
        "        domains: [pypi.org]\n"
    )
    monkeypatch.delenv("AGENTNEST_PROFILE_FILE", raising=False)
    code, out, err = run(
        capsys, "kubernetes", "manifest", "--profile", "net", "--profile-file", str(path), "-o", "json"
    )
    assert code == 0, err
    objects = _json_stream(out)
    pod = objects[-1]
    assert pod["spec"]["containers"][0]["image"] == "python:3.11-slim"
    assert pod["spec"]["containers"][0]["resources"]["limits"]["memory"] == "768Mi"
    assert len(objects) == 4  # the proxy's two objects, the sandbox's policy and pod
    # An explicit option overrides the profile.
    code, out, _ = run(
        capsys,
        "kubernetes",
        "manifest",
        "--profile",
        "net",
        "--profile-file",
        str(path),
        "--network",
        "denied",
    )
    assert code == 0
    assert [o["kind"] for o in yaml.safe_load_all(out)] == ["NetworkPolicy", "Pod"]


def test_manifest_of_a_writable_root_profile_is_what_the_backend_would_create(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "agentnest.yaml"
    path.write_text("profiles:\n  rw:\n    image: python:3.12-slim\n    read_only_root: false\n")
    code, out, err = run(
        capsys, "kubernetes", "manifest", "--profile", "rw", "--profile-file", str(path), "-o", "json"
    )
    assert code == 0, err
    (pod,) = [o for o in _json_stream(out) if o["kind"] == "Pod"]
    assert pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is False
    # Asked for by the profile: not a lint problem (the backend creates it so, see lint(writable_root=)).
    assert "readOnlyRootFilesystem" not in err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (
            ["--network", "denied", "--allow-domain", "pypi.org"],
            "--allow-domain goes with --network allowlist",
        ),
        (["--network", "allowlist"], "needs at least one --allow-domain"),
        (["--seccomp", "Unconfined"], "seccomp='Unconfined'"),
        (["--namespace", "Bad_NS"], "namespace='Bad_NS'"),
        (["--memory", "lots"], "memory='lots'"),
        (["--sandbox-id", "UPPER"], "sandbox id"),
        (["--allow-domain", "*"], "*"),
    ],
)
def test_manifest_bad_input_exits_2(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    code, out, err = run(capsys, "kubernetes", "manifest", *IMAGE, *argv)
    assert code == 2
    assert out == ""
    assert needle in err


def test_setup_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys, "kubernetes", "setup", "tenant-a", "--dry-run", "--group", "devs", "--pods", "5", "-o", "json"
    )
    assert code == 0, err
    kinds = [o["kind"] for o in _json_stream(out)]
    assert kinds == ["Namespace", "ResourceQuota", "LimitRange", "Role", "RoleBinding"]
    binding = _json_stream(out)[-1]
    assert binding["subjects"][0] == {
        "kind": "Group",
        "name": "devs",
        "apiGroup": "rbac.authorization.k8s.io",
    }


def test_setup_without_a_kubeconfig_names_the_fix(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, "kubernetes", "setup", "tenant-a", "--kubeconfig", str(tmp_path / "none"))
    assert code == 1
    assert out == ""
    assert "kubeconfig" in err and str(tmp_path / "none") in err


def test_kubernetes_without_subcommand_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "kubernetes")
    assert code == 2
    assert "manifest" in err


def test_yaml_falls_back_to_json_documents(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes `import yaml` raise ImportError, as without PyYAML.
    monkeypatch.setitem(sys.modules, "yaml", None)
    objects: list[dict[str, Any]] = [{"kind": "A", "n": 1}, {"kind": "B"}]
    text = dump(objects, "yaml")
    assert text == '---\n{\n  "kind": "A",\n  "n": 1\n}\n---\n{\n  "kind": "B"\n}\n'
    monkeypatch.undo()
    assert list(yaml.safe_load_all(text)) == objects  # JSON is YAML
