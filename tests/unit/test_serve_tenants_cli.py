"""``agentnest serve tenant ...`` and tenants in the token file (no server, no engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentnest.cli import main
from agentnest.server.auth import TokenStore


def test_tenants_round_trip_through_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / "tokens.json")
    assert (
        main(["serve", "tenant", "create", "team-a", "--tokens", path, "--weight", "2", "--max-memory", "4g"])
        == 0
    )
    assert main(["serve", "token", "create", "--tokens", path, "--name", "ci", "--tenant", "team-a"]) == 0
    capsys.readouterr()
    store = TokenStore(path)
    tenant = store.tenant("team-a")
    assert tenant is not None and tenant.weight == 2 and tenant.max_memory == 4 << 30
    assert store.list()[0].tenant == "team-a" and not store.list()[0].admin
    assert (
        main(["serve", "tenant", "update", "team-a", "--tokens", path, "--priority", "high", "--rate", "9"])
        == 0
    )
    updated = TokenStore(path).tenant("team-a")
    assert updated is not None and (updated.priority, updated.rate, updated.weight) == ("high", 9.0, 2.0)
    assert main(["serve", "tenant", "list", "--tokens", path, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [t["name"] for t in listed] == ["default", "team-a"]
    # A tenant with tokens stays; without, it goes.
    assert main(["serve", "tenant", "delete", "team-a", "--tokens", path]) == 2
    assert "still has tokens ['ci']" in capsys.readouterr().err
    assert main(["serve", "token", "revoke", "--tokens", path, "ci"]) == 0
    assert main(["serve", "tenant", "delete", "team-a", "--tokens", path]) == 0
    assert TokenStore(path).tenant("team-a") is None


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["serve", "tenant", "create", "Team"], "lowercase"),
        (
            ["serve", "tenant", "create", "t", "--default-wait", "400", "--max-wait", "300"],
            "above its max_wait",
        ),
        (["serve", "tenant", "update", "nope", "--rate", "1"], "no tenant 'nope'"),
        (["serve", "tenant", "update", "default"], "nothing to change"),
        (["serve", "token", "create", "--name", "x", "--tenant", "ghost"], "serve tenant create ghost"),
    ],
)
def test_bad_tenant_input_is_a_clear_error_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    path = tmp_path / "tokens.json"
    assert main([*argv, "--tokens", str(path)]) == 2
    assert needle in capsys.readouterr().err
    assert TokenStore(path).list() == [] and [t.name for t in TokenStore(path).tenants()] == ["default"]


def test_a_token_file_from_before_tenants_still_loads_every_token_into_default(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    store = TokenStore(path)
    token, secret = store.create("old")
    doc = json.loads(path.read_text())
    for record in doc["tokens"]:
        del record["tenant"], record["admin"]
    del doc["tenants"]
    path.write_text(json.dumps(doc))
    again = TokenStore(path).authenticate(secret)
    assert again.id == token.id and again.tenant == "default" and not again.admin
