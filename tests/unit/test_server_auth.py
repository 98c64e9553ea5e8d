"""Tokens and ceilings (agentnest.server.auth), ``agentnest serve token``, the bind rule and lazy imports."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agentnest.cli import main
from agentnest.cli.serve import check_bind
from agentnest.errors import ConfigurationError
from agentnest.server.auth import AuthError, Ceiling, TokenStore


def test_secret_is_shown_once_and_stored_hashed(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "t.json")
    token, secret = store.create("ci", Ceiling(max_memory=1024**3))
    assert secret.startswith("ant_" + token.id + "_")
    text = (tmp_path / "t.json").read_text()
    random_part = secret[len("ant_" + token.id + "_") :]  # base64url: may itself hold "_"
    assert secret not in text and random_part not in text
    assert json.loads(text)["tokens"][0]["sha256"] == token.sha256
    assert stat.S_IMODE(os.stat(tmp_path / "t.json").st_mode) == 0o600
    assert store.authenticate(secret).ceiling.max_memory == 1024**3


@pytest.mark.parametrize(
    "guess", ["", "nope", "ant_", "ant_zzzzzzzzzzzz_" + "A" * 43, "ant_" + "a" * 12 + "_" + "A" * 42]
)
def test_unknown_and_malformed_secrets(tmp_path: Path, guess: str) -> None:
    store = TokenStore(tmp_path / "t.json")
    store.create("a")
    with pytest.raises(AuthError, match="unknown"):
        store.authenticate(guess)


def test_wrong_secret_for_a_real_id_expiry_and_revocation(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "t.json")
    token, secret = store.create("a", expires_in=100)
    with pytest.raises(AuthError):
        store.authenticate(secret[:-1] + ("x" if secret[-1] != "x" else "y"))
    assert store.authenticate(secret, now=token.created + 99).id == token.id
    with pytest.raises(AuthError, match="expired"):
        store.authenticate(secret, now=token.created + 101)
    other = TokenStore(tmp_path / "t.json")  # another process: the file is the truth
    other.revoke("a")
    with pytest.raises(AuthError):
        store.authenticate(secret)


def test_bad_names_ceilings_and_files(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "t.json")
    store.create("a")
    with pytest.raises(ConfigurationError, match="exists"):
        store.create("a")
    with pytest.raises(ConfigurationError, match="name"):
        store.create("../x")
    with pytest.raises(ConfigurationError, match="network mode"):
        Ceiling(network=("everything",))
    with pytest.raises(ConfigurationError):
        Ceiling(max_cpus=-1)
    with pytest.raises(ConfigurationError, match="unknown ceiling"):
        Ceiling.from_dict({"max_gpus": 4})
    with pytest.raises(ConfigurationError, match="no token"):
        store.revoke("missing")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigurationError, match="not a token file"):
        TokenStore(tmp_path / "bad.json").list()


def test_token_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tmp_path / "tokens.json")
    code = main(
        [
            "serve",
            "token",
            "create",
            "--tokens",
            path,
            "--name",
            "ci",
            "--max-memory",
            "1g",
            "--network",
            "denied",
            "--network",
            "allowlist",
            "--domain",
            "*.pypi.org",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0
    secret = out.strip()
    assert secret.startswith("ant_") and "shown only now" in err
    assert TokenStore(path).authenticate(secret).ceiling.network == ("denied", "allowlist")
    assert main(["serve", "token", "list", "--tokens", path]) == 0
    listing = capsys.readouterr().out
    assert "ci" in listing and "memory<=1g" in listing and secret not in listing
    assert main(["serve", "token", "revoke", "--tokens", path, "ci"]) == 0
    assert TokenStore(path).list() == []
    assert main(["serve", "token", "revoke", "--tokens", path, "ci"]) == 2
    assert "no token" in capsys.readouterr().err


def test_openapi_flag_prints_the_published_spec(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--openapi"]) == 0
    spec = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
    assert capsys.readouterr().out == spec.read_text("utf-8")


def test_bind_rule() -> None:
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        check_bind(host, tls=False, insecure=False)
    with pytest.raises(ConfigurationError, match="--insecure-bind"):
        check_bind("0.0.0.0", tls=False, insecure=False)
    check_bind("0.0.0.0", tls=True, insecure=False)
    check_bind("0.0.0.0", tls=False, insecure=True)
    assert main(["serve", "--host", "0.0.0.0", "--no-audit-log"]) == 2


def test_import_agentnest_loads_no_server_dependency() -> None:
    code = (
        "import sys, agentnest, agentnest.runtime.registry, agentnest.server.auth, agentnest.cli\n"
        "bad = [m for m in ('fastapi', 'httpx', 'websockets', 'uvicorn', 'pydantic') if m in sys.modules]\n"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
