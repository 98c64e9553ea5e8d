"""The control plane through the stock SDK: create (metadata, envs, timeout), get_info,
set_timeout, connect, list with metadata filters and paging, kill; bad keys, another
tenant's sandbox and an unknown template answered with the SDK's own exceptions."""

from __future__ import annotations

import uuid

import pytest

from .conftest import SDK, Observed

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def lifecycle(sdk: SDK) -> Observed:
    return sdk.run("lifecycle", tag=f"lc-{uuid.uuid4().hex[:10]}")


def _three(o: Observed) -> tuple[str, str, str]:
    return (
        o.value("create")["sandbox_id"],
        o.value("create_second")["sandbox_id"],
        o.value("create_third")["sandbox_id"],
    )


def test_create_with_metadata_envs_and_timeout(lifecycle: Observed) -> None:
    first = lifecycle.value("create")["sandbox_id"]
    info = lifecycle.value("info")
    assert info["sandbox_id"] == first
    assert info["metadata"] == {"suite": lifecycle.args["tag"], "which": "first"}
    assert info["state"] == "running"
    assert 115 <= info["lifetime"] <= 125, info  # timeout=120 s from the start
    assert lifecycle.value("is_running") is True
    # envs given to create are the sandbox's environment for every command.
    assert lifecycle.value("create_envs")["stdout"] == "from-create"
    assert lifecycle.value("info_by_id")["sandbox_id"] == first


def test_set_timeout_moves_the_deadline_both_ways(lifecycle: Observed) -> None:
    lifecycle.value("set_timeout")
    assert 290 <= lifecycle.value("info_after_set_timeout")["left"] <= 301
    lifecycle.value("set_timeout_shorter")
    assert 190 <= lifecycle.value("info_after_shorter")["left"] <= 201


def test_connect_by_id(lifecycle: Observed) -> None:
    first = lifecycle.value("create")["sandbox_id"]
    assert lifecycle.value("connect") == {"sandbox_id": first, "echo": "connected\n"}


def test_list_filters_by_metadata(lifecycle: Observed) -> None:
    first, second, third = _three(lifecycle)
    by_tag = lifecycle.value("list_by_metadata")
    assert sorted(by_tag["ids"]) == sorted([first, second, third])
    assert by_tag["metadata"][second]["which"] == "second"
    assert set(by_tag["states"]) == {"running"}
    assert lifecycle.value("list_by_two_keys")["ids"] == [second]
    assert lifecycle.value("list_no_match")["ids"] == []
    assert {first, second, third} <= set(lifecycle.value("list_all")["ids"])


def test_list_pages_with_limit_and_next_token(lifecycle: Observed) -> None:
    first, second, third = _three(lifecycle)
    paged = lifecycle.value("list_paged")
    assert [len(page) for page in paged["pages"]] == [2, 1], paged
    assert paged["tokens"][0], "the first page must carry a next token"
    assert not paged["tokens"][-1], "the last page must carry none"
    seen = [sid for page in paged["pages"] for sid in page]
    assert sorted(seen) == sorted([first, second, third])


def test_kill_then_the_sandbox_is_gone(lifecycle: Observed) -> None:
    first, second, _ = _three(lifecycle)
    assert lifecycle.value("kill_instance") is True
    assert lifecycle.value("kill_again") is False
    lifecycle.error("info_killed", "NotFoundException")
    lifecycle.error("connect_killed", "NotFoundException")
    assert sorted(lifecycle.value("list_after_kill")["ids"]) == sorted([first, second])
    assert lifecycle.value("kill_by_id") is True
    assert lifecycle.value("kill_second") is True


def test_kill_of_an_unknown_id(lifecycle: Observed) -> None:
    assert lifecycle.value("kill_unknown") is False
    lifecycle.error("info_unknown", "NotFoundException")


# -- bad input --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bad(sdk: SDK, shared_sandbox: str) -> Observed:
    wrong = "e2b_" + uuid.uuid4().hex + uuid.uuid4().hex[:8]
    return sdk.run("bad", sandbox_id=shared_sandbox, other_key=sdk.server.other_key, wrong_key=wrong)


def test_a_wrong_key_is_an_authentication_error(bad: Observed) -> None:
    for key in (
        "wrong_key_create",
        "wrong_key_list",
        "wrong_key_info",
        "wrong_key_connect",
        "wrong_key_kill",
    ):
        bad.error(key, "AuthenticationException")
    assert bad.value("own_still_alive")["stdout"] == "alive\n"


def test_another_tenants_sandbox_is_not_found(bad: Observed) -> None:
    for key in ("other_connect", "other_info", "other_set_timeout"):
        err = bad.error(key, "NotFoundException")
        assert err.get("status_code") in (None, 404), err
        assert "403" not in err["message"] and "forbidden" not in err["message"].lower(), err
    assert bad.value("other_kill") is False
    assert bad.value("other_listed") is False
    # Nothing was done to it: it runs, and its owner still sees it.
    assert bad.value("other_alive")["stdout"] == "alive\n"
    other = bad.value("other_create")["sandbox_id"]
    assert bad.value("other_info_own_key")["sandbox_id"] == other
    assert bad.value("other_cleanup") is True


def test_an_unknown_template_is_named_in_the_error(bad: Observed) -> None:
    err = bad.error("unknown_template", "SandboxException")
    assert "agentnest-no-such-template" in err["message"], err
    assert bad.value("list_after_unknown_template") == bad.value("list_before_unknown_template")


def test_no_key_or_secret_reaches_the_audit_log(bad: Observed, sdk: SDK) -> None:
    server = sdk.server
    assert server.events.events, "the audit log is empty"
    logged = repr(server.events.events)
    for secret in (bad.args["wrong_key"], server.alice, server.bob, server.key, server.other_key):
        assert secret not in logged
