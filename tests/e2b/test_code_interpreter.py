"""``run_code`` of the stock ``e2b-code-interpreter`` against our Python sessions: stdout and
stderr, text results, errors with tracebacks, rich display items (PNG, HTML), execution
counts, callbacks, and code contexts.  Python only: another language is an error."""

from __future__ import annotations

import pytest

from .conftest import SDK, Observed

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def code(sdk: SDK, shared_sandbox: str) -> Observed:
    return sdk.run("code", sandbox_id=shared_sandbox)


def test_stdout_and_stderr(code: Observed) -> None:
    out = code.value("stdout")
    assert "".join(out["stdout"]) == "hello from python\n" and out["error"] is None
    assert out["results"] == [] and out["text"] is None
    err = code.value("stderr")
    assert "".join(err["stderr"]) == "to stderr\n" and err["stdout"] == []


def test_one_plus_one_is_the_text_result_2(code: Observed) -> None:
    got = code.value("one_plus_one")
    assert got["text"] == "2"
    assert [r["is_main_result"] for r in got["results"]] == [True]


def test_state_persists_between_runs(code: Observed) -> None:
    assert code.value("state_set")["results"] == []
    assert code.value("state_read")["text"] == "42"


def test_an_error_has_name_value_and_traceback(code: Observed) -> None:
    got = code.value("error")
    error = got["error"]
    assert error is not None, got
    assert error["name"] == "ZeroDivisionError"
    assert error["value"] == "division by zero"
    assert "ZeroDivisionError" in error["traceback"] and "1/0" in error["traceback"]
    assert got["results"] == []
    assert code.value("after_error")["text"] == "'alive'"


def test_display_items_png_and_html(code: Observed) -> None:
    got = code.value("display")
    assert got["error"] is None, got["error"]
    results = got["results"]
    assert [r["is_main_result"] for r in results] == [False, False, True], results
    png, html, main = results
    assert "png" in png["formats"] and png["png_size"] == [1, 1]
    assert html["html"] == "<b>bold</b>"
    assert "png" in main["formats"] and main["png_size"] == [1, 1]


def test_callbacks_see_output_and_results(code: Observed) -> None:
    seen = code.value("callbacks")
    assert "".join(seen["stdout"]) == "cb-out\n"
    assert "".join(seen["stderr"]) == "cb-err\n"
    assert seen["result"] == ["42"]


def test_execution_count_increases(code: Observed) -> None:
    counts = [code.value(k)["execution_count"] for k in ("stdout", "stderr", "one_plus_one", "state_set")]
    counts += code.value("counts")
    assert all(isinstance(n, int) for n in counts), counts
    assert counts == sorted(counts) and len(set(counts)) == len(counts), counts


def test_only_python_is_served(code: Observed) -> None:
    record = code.record("javascript")
    if "error" in record:
        message = record["error"]["message"]
    else:
        error = record["value"]["error"]
        assert error is not None, f"javascript ran: {record['value']}"
        message = f"{error['name']}: {error['value']}"
    assert "javascript" in message.lower() or "python" in message.lower(), message


def test_code_contexts(code: Observed) -> None:
    ctx = code.value("context_create")
    assert ctx["id"] and ctx["language"] == "python"
    assert code.value("context_set")["error"] is None
    assert code.value("context_read")["text"] == "'in the context'"
    # Contexts are separate namespaces: the default one has no an_ctx, the new one no an_value.
    assert code.value("context_isolated")["error"]["name"] == "NameError"
    assert code.value("context_default_sees_own")["error"]["name"] == "NameError"
    assert ctx["id"] in code.value("context_list")
    assert code.value("context_remove") is True
    assert ctx["id"] not in code.value("context_list_after")
    removed = code.record("context_run_removed")
    if "error" not in removed:
        assert removed["value"]["error"] is not None, "a removed context still ran code"
    else:
        code.error("context_run_removed", "SandboxException")
    cwd = code.value("context_cwd_run")["text"]
    assert cwd in ("'/home/user'", "'/workspace'"), cwd
