"""Scenarios that drive the stock E2B SDK against ``agentnest serve``; run in the SDK's own venv.

Usage: ``python sdk_driver.py SCENARIO`` with the scenario's arguments as one JSON object on
stdin, and ``E2B_API_URL``, ``E2B_SANDBOX_URL`` and ``E2B_API_KEY`` in the environment.

Each check prints one JSON line as soon as it is done: ``{"key": K, "value": V}``, or
``{"key": K, "error": {"type", "mro", "message", ...}}`` when the SDK raised; the last line
is ``{"done": true}``.  A check that hangs is cut by an alarm (recorded as an error), and the
lines printed before a crash still reach the test.  The tests (tests/e2b/test_*.py) assert
on what was observed; this file only reports.  It imports the standard library and the SDK
only: AgentNest is not installed in the SDK's venv.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import functools
import importlib
import io
import json
import signal
import struct
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from typing import Any

#: A check taking longer than this is cut (the SDK's own timeouts should fire well before).
STEP_SECONDS = 60.0


class StepTimeout(Exception):
    """A check ran past STEP_SECONDS."""


def _alarm(_signum: int, _frame: object) -> None:
    raise StepTimeout(f"the check took longer than {STEP_SECONDS:g} s")


def describe(exc: BaseException) -> dict[str, Any]:
    """An SDK exception as data: its class names (for isinstance checks) and what it carries."""
    out: dict[str, Any] = {
        "type": type(exc).__name__,
        "module": type(exc).__module__,
        "mro": [cls.__name__ for cls in type(exc).__mro__],
        "message": str(exc)[:4000],
    }
    for attr in ("exit_code", "stdout", "stderr", "status_code", "error"):
        got = getattr(exc, attr, None)
        if got is None or isinstance(got, (str, int, float, bool)):
            out[attr] = got
    if isinstance(exc, StepTimeout) or not out["mro"][0].endswith("Exception"):
        out["traceback"] = "".join(traceback.format_exception(exc))[-3000:]
    return out


class Checks:
    """Runs checks one by one and reports each as a JSON line on stdout."""

    def __init__(self) -> None:
        signal.signal(signal.SIGALRM, _alarm)

    def emit(self, record: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(record, default=str) + "\n")
        sys.stdout.flush()

    def check(self, key: str, fn: Callable[[], Any], show: Callable[[Any], Any] | None = None) -> Any:
        """Run ``fn``; report ``show(result)`` (or the result) under ``key``; return the result.

        An exception is reported as an error and None is returned.
        """
        print(f"check {key}", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, STEP_SECONDS)
        try:
            result = fn()
            shown = show(result) if show is not None else result
        except BaseException as exc:
            signal.setitimer(signal.ITIMER_REAL, 0)
            if isinstance(exc, KeyboardInterrupt):
                raise
            self.emit({"key": key, "error": describe(exc), "seconds": time.monotonic() - t0})
            return None
        signal.setitimer(signal.ITIMER_REAL, 0)
        self.emit({"key": key, "value": shown, "seconds": time.monotonic() - t0})
        return result


def sdk() -> Any:
    return importlib.import_module("e2b")


def interpreter() -> Any:
    return importlib.import_module("e2b_code_interpreter")


def when(value: Any) -> str | None:
    return value.isoformat() if isinstance(value, datetime.datetime) else None


def info_of(info: Any) -> dict[str, Any]:
    now = datetime.datetime.now(datetime.timezone.utc)
    state = getattr(info, "state", None)
    return {
        "sandbox_id": info.sandbox_id,
        "template_id": info.template_id,
        "metadata": dict(info.metadata or {}),
        "state": str(getattr(state, "value", state)),
        "started_at": when(info.started_at),
        "end_at": when(info.end_at),
        "lifetime": (info.end_at - info.started_at).total_seconds(),
        "left": (info.end_at - now).total_seconds(),
        "envd_version": getattr(info, "envd_version", None),
    }


def ids(items: Any) -> list[str]:
    return [item.sandbox_id for item in items]


def result_of(result: Any) -> dict[str, Any]:
    """A command's result (CommandResult)."""
    return {"stdout": result.stdout, "stderr": result.stderr, "exit_code": result.exit_code}


def entry_of(entry: Any) -> dict[str, Any]:
    kind = getattr(entry, "type", None)
    return {
        "name": entry.name,
        "path": entry.path,
        "type": str(getattr(kind, "value", kind)),
        "size": getattr(entry, "size", None),
    }


# -- scenarios -----------------------------------------------------------------------------


def scenario_create(args: dict[str, Any], c: Checks) -> None:
    """One sandbox of the code interpreter's template for the other scenarios to connect to."""
    cls = interpreter().Sandbox if args.get("interpreter", True) else sdk().Sandbox
    c.check(
        "create",
        lambda: cls.create(timeout=args.get("timeout", 600), metadata=args.get("metadata") or None),
        lambda s: {"sandbox_id": s.sandbox_id},
    )


def scenario_kill(args: dict[str, Any], c: Checks) -> None:
    c.check("kill", lambda: sdk().Sandbox.kill(args["sandbox_id"]))


def scenario_lifecycle(args: dict[str, Any], c: Checks) -> None:
    """Create (metadata, envs, timeout), get_info, set_timeout, connect, list and paging, kill."""
    e2b = sdk()
    sandbox = e2b.Sandbox
    tag = args["tag"]
    query = e2b.SandboxQuery
    first = c.check(
        "create",
        lambda: sandbox.create(
            template="base",
            timeout=120,
            metadata={"suite": tag, "which": "first"},
            envs={"AN_CREATE_ENV": "from-create"},
        ),
        lambda s: {"sandbox_id": s.sandbox_id},
    )
    if first is None:
        return
    c.check("info", first.get_info, info_of)
    c.check("is_running", first.is_running)
    c.check("create_envs", lambda: first.commands.run('printf %s "$AN_CREATE_ENV"'), result_of)
    c.check("set_timeout", lambda: first.set_timeout(300))
    c.check("info_after_set_timeout", first.get_info, info_of)
    c.check("set_timeout_shorter", lambda: first.set_timeout(200))
    c.check("info_after_shorter", first.get_info, info_of)
    c.check("info_by_id", lambda: sandbox.get_info(first.sandbox_id), info_of)

    def connect() -> dict[str, Any]:
        again = sandbox.connect(first.sandbox_id)
        return {"sandbox_id": again.sandbox_id, "echo": again.commands.run("echo connected").stdout}

    c.check("connect", connect)

    def create(which: str) -> Any:
        made = sandbox.create(timeout=60, metadata={"suite": tag, "which": which})
        return made

    others = [
        c.check(f"create_{which}", functools.partial(create, which), lambda s: {"sandbox_id": s.sandbox_id})
        for which in ("second", "third")
    ]

    def listed(**kwargs: Any) -> dict[str, Any]:
        paginator = sandbox.list(**kwargs)
        items = paginator.next_items()
        return {
            "ids": ids(items),
            "metadata": {item.sandbox_id: dict(item.metadata or {}) for item in items},
            "states": [str(getattr(item.state, "value", item.state)) for item in items],
            "has_next": paginator.has_next,
        }

    c.check("list_by_metadata", lambda: listed(query=query(metadata={"suite": tag})))
    c.check("list_by_two_keys", lambda: listed(query=query(metadata={"suite": tag, "which": "second"})))
    c.check("list_no_match", lambda: listed(query=query(metadata={"suite": tag + "-none"})))
    c.check("list_all", lambda: listed())

    def paged() -> dict[str, Any]:
        paginator = sandbox.list(query=query(metadata={"suite": tag}), limit=2)
        pages: list[list[str]] = []
        tokens: list[str | None] = []
        while paginator.has_next and len(pages) < 5:
            pages.append(ids(paginator.next_items()))
            tokens.append(paginator.next_token)
        return {"pages": pages, "tokens": tokens}

    c.check("list_paged", paged)
    third = others[1]
    if third is not None:
        c.check("kill_instance", third.kill)
        c.check("kill_again", lambda: sandbox.kill(third.sandbox_id))
        c.check("info_killed", lambda: sandbox.get_info(third.sandbox_id), info_of)
        c.check("connect_killed", lambda: sandbox.connect(third.sandbox_id).sandbox_id)
        c.check("list_after_kill", lambda: listed(query=query(metadata={"suite": tag})))
    c.check("kill_unknown", lambda: sandbox.kill("agentnestnosuchsandbox0"))
    c.check("info_unknown", lambda: sandbox.get_info("agentnestnosuchsandbox0"), info_of)
    c.check("kill_by_id", lambda: sandbox.kill(first.sandbox_id))
    if others[0] is not None:
        c.check("kill_second", others[0].kill)


def connect(args: dict[str, Any], c: Checks, *, interpreter_sdk: bool = False) -> Any:
    cls = interpreter().Sandbox if interpreter_sdk else sdk().Sandbox
    return c.check("connect", lambda: cls.connect(args["sandbox_id"]), lambda s: {"sandbox_id": s.sandbox_id})


def scenario_commands(args: dict[str, Any], c: Checks) -> None:
    """commands.run foreground and background, stdin, envs, cwd, user, timeout, list, connect, kill."""
    sbx = connect(args, c)
    if sbx is None:
        return
    run = sbx.commands.run
    c.check("foreground", lambda: run("echo out; echo err >&2"), result_of)
    c.check("exit_code", lambda: run("echo partial; echo bad >&2; exit 3"), result_of)
    c.check("envs", lambda: run('printf %s "$AN_FOO"', envs={"AN_FOO": "bar baz"}), result_of)
    c.check("default_cwd", lambda: run("pwd"), result_of)
    c.check("make_cwd", lambda: sbx.files.make_dir("/home/user/cwd-test/inner"))
    c.check("cwd", lambda: run("pwd; ls", cwd="/home/user/cwd-test"), result_of)
    c.check("cwd_relative_file", lambda: run("echo made > here.txt", cwd="/home/user/cwd-test"), result_of)
    c.check("cwd_file_seen", lambda: sbx.files.read("/home/user/cwd-test/here.txt"))
    c.check("user_user", lambda: run("id -un; id -u", user="user"), result_of)
    c.check("user_root", lambda: run("id -u", user="root"), result_of)

    def timed_out() -> dict[str, Any]:
        t0 = time.monotonic()
        try:
            run("sleep 30", timeout=1)
        except BaseException as exc:
            return {"raised": describe(exc), "seconds": time.monotonic() - t0}
        return {"raised": None, "seconds": time.monotonic() - t0}

    c.check("timeout", timed_out)
    c.check("after_timeout", lambda: run("echo still here"), result_of)

    # Background: a handle with a pid, listed, waited for.
    handle = c.check(
        "background_start",
        lambda: run("echo begin; read -t 30 x; echo end", background=True, stdin=True),
        lambda h: {"pid": h.pid},
    )
    if handle is not None:
        c.check(
            "list_running",
            sbx.commands.list,
            lambda procs: [{"pid": p.pid, "cmd": p.cmd, "args": list(p.args), "cwd": p.cwd} for p in procs],
        )
        c.check("background_send", lambda: sbx.commands.send_stdin(handle.pid, "go\n"))
        c.check("background_wait", handle.wait, result_of)
        c.check("list_after_wait", lambda: [p.pid for p in sbx.commands.list()])

    # Kill: the handle's kill(), then wait() reports how it ended; a second kill finds nothing.
    victim = c.check("kill_start", lambda: run("sleep 120", background=True), lambda h: {"pid": h.pid})
    if victim is not None:
        c.check("kill_listed", lambda: victim.pid in [p.pid for p in sbx.commands.list()])
        c.check("kill", victim.kill)
        c.check("kill_wait", victim.wait, result_of)
        c.check("kill_list_after", lambda: victim.pid in [p.pid for p in sbx.commands.list()])
        c.check("kill_again", lambda: sbx.commands.kill(victim.pid))
    c.check("kill_unknown_pid", lambda: sbx.commands.kill(987654))

    # Connect: a second handle on a running command gets the output written after it attached.
    waiting = c.check(
        "connect_start",
        lambda: run('echo first; read -t 30 line; echo "later:$line"', background=True, stdin=True),
        lambda h: {"pid": h.pid},
    )
    if waiting is not None:
        attached = c.check(
            "connect_attach", lambda: sbx.commands.connect(waiting.pid), lambda h: {"pid": h.pid}
        )
        c.check("connect_disconnect_first", waiting.disconnect)
        c.check("connect_send", lambda: sbx.commands.send_stdin(waiting.pid, "from-stdin\n"))
        if attached is not None:
            c.check("connect_wait", attached.wait, result_of)
    c.check("connect_unknown_pid", lambda: sbx.commands.connect(987654).pid)

    # stdin: several sends, then EOF by close_stdin.
    cat = c.check("stdin_start", lambda: run("cat", background=True, stdin=True), lambda h: {"pid": h.pid})
    if cat is not None:
        c.check("stdin_send_text", lambda: sbx.commands.send_stdin(cat.pid, "one\n"))
        c.check("stdin_send_bytes", lambda: sbx.commands.send_stdin(cat.pid, b"two\xc3\xa9\n"))
        closed = c.check("stdin_close", lambda: sbx.commands.close_stdin(cat.pid) or True)
        if closed is None:  # an SDK or envd version without close_stdin: end it by hand
            c.check("stdin_kill", lambda: sbx.commands.kill(cat.pid))
        c.check("stdin_wait", cat.wait, result_of)
    c.check("stdin_unknown_pid", lambda: sbx.commands.send_stdin(987654, "x"))


def scenario_files(args: dict[str, Any], c: Checks) -> None:
    """Every files call, relative and absolute paths, and the paths that must be refused."""
    sbx = connect(args, c)
    if sbx is None:
        return
    files = sbx.files
    blob = bytes(range(256)) * 4
    c.check("write_str", lambda: files.write("fs/a.txt", "hello\nworld\n"), entry_of)
    c.check("write_bytes", lambda: files.write("/home/user/fs/b.bin", blob), entry_of)
    c.check("write_filelike", lambda: files.write("fs/c.txt", io.BytesIO(b"from a file object")), entry_of)
    c.check("write_textio", lambda: files.write("fs/t.txt", io.StringIO("text io")), entry_of)
    c.check(
        "write_files",
        lambda: files.write_files(
            [
                {"path": "fs/multi/x.txt", "data": "x-data"},
                {"path": "/home/user/fs/multi/y.bin", "data": b"y-data"},
                {"path": "fs/multi/deep/z.txt", "data": io.BytesIO(b"z-data")},
            ]
        ),
        lambda infos: [entry_of(i) for i in infos],
    )
    c.check("read_text", lambda: files.read("fs/a.txt"))
    c.check("read_absolute", lambda: files.read("/home/user/fs/a.txt"))
    c.check("read_bytes", lambda: base64.b64encode(bytes(files.read("fs/b.bin", format="bytes"))).decode())

    def stream() -> str:
        reader = files.read("fs/c.txt", format="stream")
        try:
            return b"".join(bytes(chunk) for chunk in reader).decode()
        finally:
            with contextlib.suppress(Exception):
                reader.close()

    c.check("read_stream", stream)
    c.check("read_textio", lambda: files.read("fs/t.txt"))
    c.check(
        "read_multi",
        lambda: [files.read(p) for p in ("fs/multi/x.txt", "fs/multi/y.bin", "fs/multi/deep/z.txt")],
    )
    c.check("read_missing", lambda: files.read("fs/missing.txt"))
    c.check("list_depth1", lambda: files.list("fs"), lambda es: [entry_of(e) for e in es])
    c.check("list_depth2", lambda: files.list("/home/user/fs", depth=2), lambda es: [entry_of(e) for e in es])
    c.check("list_home", lambda: files.list("/home/user"), lambda es: [entry_of(e) for e in es])
    c.check("list_missing", lambda: files.list("fs/nowhere"), lambda es: [entry_of(e) for e in es])
    c.check("exists_file", lambda: files.exists("fs/a.txt"))
    c.check("exists_dir", lambda: files.exists("/home/user/fs/multi"))
    c.check("exists_missing", lambda: files.exists("fs/missing.txt"))
    c.check("info_file", lambda: files.get_info("fs/b.bin"), entry_of)
    c.check("info_dir", lambda: files.get_info("fs/multi"), entry_of)
    c.check("info_missing", lambda: files.get_info("fs/missing.txt"), entry_of)
    c.check("make_dir_new", lambda: files.make_dir("fs/made/nested"))
    c.check("make_dir_again", lambda: files.make_dir("fs/made/nested"))
    c.check("make_dir_is_dir", lambda: files.get_info("fs/made/nested"), entry_of)
    c.check("rename", lambda: files.rename("fs/a.txt", "fs/made/renamed.txt"), entry_of)
    c.check("rename_old_gone", lambda: files.exists("fs/a.txt"))
    c.check("rename_new_read", lambda: files.read("/home/user/fs/made/renamed.txt"))
    c.check("rename_missing", lambda: files.rename("fs/missing.txt", "fs/other.txt"), entry_of)
    c.check("remove_file", lambda: files.remove("fs/made/renamed.txt"))
    c.check("remove_file_gone", lambda: files.exists("fs/made/renamed.txt"))
    c.check("remove_dir", lambda: files.remove("fs/multi"))
    c.check("remove_dir_gone", lambda: files.exists("fs/multi/deep/z.txt"))
    # Outside the workspace: each refused, nothing read or written.
    c.check("outside_read", lambda: files.read("/etc/passwd"))
    c.check("outside_read_dotdot", lambda: files.read("../../etc/passwd"))
    c.check("outside_write", lambda: files.write("/etc/agentnest-e2b-probe", "x"), entry_of)
    c.check("outside_write_dotdot", lambda: files.write("../agentnest-e2b-probe", "x"), entry_of)
    c.check("outside_list", lambda: files.list("/etc"), lambda es: [entry_of(e) for e in es])
    c.check("outside_make_dir", lambda: files.make_dir("/opt/agentnest-e2b-probe"))
    c.check("outside_rename", lambda: files.rename("fs/b.bin", "/tmp/../etc/b.bin"), entry_of)
    c.check("outside_remove", lambda: files.remove("/etc/hostname"))
    c.check(
        "outside_seen_by_shell",
        lambda: sbx.commands.run(
            "ls /etc/agentnest-e2b-probe /home/agentnest-e2b-probe /opt/agentnest-e2b-probe /etc/b.bin"
            " 2>/dev/null; test -f /etc/hostname && echo hostname-kept"
        ),
        result_of,
    )
    # Above the server's upload limit: refused, and no file left.
    limit = int(args["upload_limit"])
    c.check("upload_too_big", lambda: files.write("fs/big.bin", b"\0" * (limit + 4096)), entry_of)
    c.check(
        "upload_too_big_filelike",
        lambda: files.write("fs/big2.bin", io.BytesIO(b"\0" * (limit + 4096))),
        entry_of,
    )
    c.check("upload_too_big_left", lambda: [files.exists("fs/big.bin"), files.exists("fs/big2.bin")])
    c.check("upload_at_limit", lambda: files.write("fs/fits.bin", b"\1" * (limit // 2)), entry_of)


PNG_CELL = """
import struct, zlib
def _chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
class Dot:
    def _repr_png_(self):
        raw = b"\\x00\\xff\\x00\\x00"
        head = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
        body = _chunk(b"IHDR", head) + _chunk(b"IDAT", zlib.compress(raw)) + _chunk(b"IEND", b"")
        return b"\\x89PNG\\r\\n\\x1a\\n" + body
class Page:
    def _repr_html_(self):
        return "<b>bold</b>"
display(Dot())
display(Page())
Dot()
"""

FORMATS = (
    "text",
    "html",
    "markdown",
    "svg",
    "png",
    "jpeg",
    "pdf",
    "latex",
    "json",
    "javascript",
    "data",
    "chart",
)


def png_size(data: bytes) -> list[int] | None:
    if not data.startswith(b"\x89PNG\r\n\x1a\n") or data[12:16] != b"IHDR":
        return None
    return list(struct.unpack(">II", data[16:24]))


def execution_of(execution: Any) -> dict[str, Any]:
    results = []
    for r in execution.results:
        item: dict[str, Any] = {"is_main_result": r.is_main_result}
        item["formats"] = [f for f in FORMATS if getattr(r, f, None) is not None]
        item["text"] = r.text
        item["html"] = r.html
        if r.png is not None:
            item["png_size"] = png_size(base64.b64decode(r.png))
        results.append(item)
    error = execution.error
    return {
        "text": execution.text,
        "stdout": list(execution.logs.stdout),
        "stderr": list(execution.logs.stderr),
        "results": results,
        "error": None
        if error is None
        else {"name": error.name, "value": error.value, "traceback": error.traceback},
        "execution_count": execution.execution_count,
    }


def scenario_code(args: dict[str, Any], c: Checks) -> None:
    """run_code: stdout, stderr, results (text, png, html), errors, execution counts, contexts."""
    sbx = connect(args, c, interpreter_sdk=True)
    if sbx is None:
        return
    run = sbx.run_code
    c.check("stdout", lambda: run("print('hello from python')"), execution_of)
    c.check("stderr", lambda: run("import sys\nprint('to stderr', file=sys.stderr)"), execution_of)
    c.check("one_plus_one", lambda: run("1+1"), execution_of)
    c.check("state_set", lambda: run("an_value = 41"), execution_of)
    c.check("state_read", lambda: run("an_value + 1"), execution_of)
    c.check("error", lambda: run("def f():\n    return 1/0\nf()"), execution_of)
    c.check("after_error", lambda: run("'alive'"), execution_of)
    c.check("display", lambda: run(PNG_CELL), execution_of)
    c.check("callbacks", lambda: callbacks(run), None)
    c.check("counts", lambda: [run("0").execution_count for _ in range(3)])
    c.check("javascript", lambda: run("1", language="javascript"), execution_of)
    ctx = c.check(
        "context_create", lambda: sbx.create_code_context(), lambda x: {"id": x.id, "language": x.language}
    )
    if ctx is not None:
        c.check("context_set", lambda: run("an_ctx = 'in the context'", context=ctx), execution_of)
        c.check("context_read", lambda: run("an_ctx", context=ctx), execution_of)
        c.check("context_isolated", lambda: run("an_ctx"), execution_of)
        c.check("context_default_sees_own", lambda: run("an_value", context=ctx), execution_of)
        c.check("context_list", lambda: [x.id for x in sbx.list_code_contexts()])
        c.check("context_remove", lambda: sbx.remove_code_context(ctx) or True)
        c.check("context_list_after", lambda: [x.id for x in sbx.list_code_contexts()])
        c.check("context_run_removed", lambda: run("1", context=ctx), execution_of)
    cwd = c.check("context_cwd", lambda: sbx.create_code_context(cwd="/home/user"), lambda x: {"id": x.id})
    if cwd is not None:
        c.check("context_cwd_run", lambda: run("import os\nos.getcwd()", context=cwd), execution_of)


def callbacks(run: Callable[..., Any]) -> dict[str, Any]:
    seen: dict[str, list[Any]] = {"stdout": [], "stderr": [], "result": []}
    run(
        "import sys\nprint('cb-out')\nprint('cb-err', file=sys.stderr)\n6*7",
        on_stdout=lambda m: seen["stdout"].append(m.line),
        on_stderr=lambda m: seen["stderr"].append(m.line),
        on_result=lambda r: seen["result"].append(r.text),
    )
    return seen


def scenario_bad(args: dict[str, Any], c: Checks) -> None:
    """Wrong key, another tenant's sandbox, an unknown template: each the SDK's own exception."""
    sandbox = sdk().Sandbox
    wrong = args.get("wrong_key") or "e2b_" + uuid.uuid4().hex
    c.check("wrong_key_create", lambda: sandbox.create(timeout=30, api_key=wrong).sandbox_id)
    c.check("wrong_key_list", lambda: ids(sandbox.list(api_key=wrong).next_items()))
    c.check("wrong_key_info", lambda: sandbox.get_info(args["sandbox_id"], api_key=wrong), info_of)
    c.check("wrong_key_connect", lambda: sandbox.connect(args["sandbox_id"], api_key=wrong).sandbox_id)
    c.check("wrong_key_kill", lambda: sandbox.kill(args["sandbox_id"], api_key=wrong))
    c.check(
        "own_still_alive", lambda: sandbox.connect(args["sandbox_id"]).commands.run("echo alive"), result_of
    )
    c.check("list_before_unknown_template", lambda: ids(sandbox.list().next_items()))
    c.check("unknown_template", lambda: sandbox.create("agentnest-no-such-template", timeout=30).sandbox_id)
    c.check("list_after_unknown_template", lambda: ids(sandbox.list().next_items()))
    other = c.check(
        "other_create",
        lambda: sandbox.create(timeout=120, api_key=args["other_key"], metadata={"owner": "other"}),
        lambda s: {"sandbox_id": s.sandbox_id},
    )
    if other is None:
        return
    oid = other.sandbox_id
    c.check("other_connect", lambda: sandbox.connect(oid).sandbox_id)
    c.check("other_info", lambda: sandbox.get_info(oid), info_of)
    c.check("other_kill", lambda: sandbox.kill(oid))
    c.check("other_set_timeout", lambda: sandbox.set_timeout(oid, 5))
    c.check("other_listed", lambda: oid in ids(sandbox.list().next_items()))
    c.check("other_alive", lambda: other.commands.run("echo alive"), result_of)
    c.check("other_info_own_key", lambda: sandbox.get_info(oid, api_key=args["other_key"]), info_of)
    c.check("other_cleanup", other.kill)


def scenario_smolagents(args: dict[str, Any], c: Checks) -> None:
    """smolagents' E2BExecutor under a scripted CodeAgent (no model call, no network)."""
    smolagents = importlib.import_module("smolagents")
    models = importlib.import_module("smolagents.models")
    replies = [
        "Thought: compute.\n<code>\nimport os\nvalue = n * 2\nprint('cwd is', os.getcwd())\n</code>",
        "Thought: answer.\n<code>\nfinal_answer({'value': value, 'uid': os.getuid(), "
        "'hostname': open('/etc/hostname').read().strip()})\n</code>",
    ]

    model: Any = smolagents.Model

    class Scripted(model):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(model_id="scripted")
            self.replies = list(replies)

        def generate(self, messages: list[Any], **kwargs: Any) -> Any:
            return smolagents.ChatMessage(
                role=smolagents.MessageRole.ASSISTANT,
                content=self.replies.pop(0),
                token_usage=models.TokenUsage(1, 1),
            )

    agent = c.check(
        "agent",
        lambda: smolagents.CodeAgent(
            tools=[],
            model=Scripted(),
            executor_type="e2b",
            executor_kwargs={"metadata": {"suite": args["tag"]}, "timeout": 300},
            max_steps=4,
            verbosity_level=0,
        ),
        lambda a: {"sandbox_id": a.python_executor.sandbox.sandbox_id},
    )
    if agent is None:
        return
    c.check("run", lambda: agent.run("Double n.", additional_args={"n": 21}))
    c.check(
        "steps",
        lambda: [
            {
                "code": getattr(step, "code_action", None),
                "error": str(getattr(step, "error", None) or "")[:1500],
            }
            for step in agent.memory.steps
        ],
    )
    sid = agent.python_executor.sandbox.sandbox_id
    c.check("cleanup", agent.cleanup)
    c.check("gone", lambda: sdk().Sandbox.connect(sid).sandbox_id)


def scenario_terminal(args: dict[str, Any], c: Checks) -> None:
    """A pty (input, resize, exit), a directory watch, and pause then connect (a resume)."""
    e2b = sdk()
    sbx = c.check("create", lambda: e2b.Sandbox.create(timeout=120), lambda s: {"sandbox_id": s.sandbox_id})
    if sbx is None:
        return
    size = importlib.import_module("e2b.sandbox.commands.command_handle").PtySize
    out: list[bytes] = []
    pty = c.check("pty_create", lambda: sbx.pty.create(size(rows=24, cols=80)), lambda h: {"pid": h.pid})
    if pty is not None:
        c.check("pty_send", lambda: sbx.pty.send_stdin(pty.pid, b"echo pty-$((40+2))\n"))
        c.check("pty_resize", lambda: sbx.pty.resize(pty.pid, size(rows=30, cols=100)))
        c.check("pty_size_and_exit", lambda: sbx.pty.send_stdin(pty.pid, b"stty size; exit 7\n"))

        def waited() -> dict[str, Any]:
            try:
                result = pty.wait(on_pty=lambda data: out.append(bytes(data)))
                code = result.exit_code
            except BaseException as exc:  # a non-zero exit raises; its code is what matters
                code = getattr(exc, "exit_code", None)
            return {"exit_code": code, "output": b"".join(out).decode("utf-8", "replace")}

        c.check("pty_wait", waited)

    watcher = c.check(
        "watch_start", lambda: sbx.files.watch_dir("/home/user", recursive=True), lambda w: True
    )
    if watcher is not None:
        c.check("watch_write", lambda: sbx.files.write("watched/a.txt", "x") and True)

        def events() -> list[list[str]]:
            seen: list[list[str]] = []
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and ["watched/a.txt", "CREATE"] not in seen:
                seen += [[e.name, e.type.name] for e in watcher.get_new_events()]
                time.sleep(0.1)
            return seen

        c.check("watch_events", events)
        c.check("watch_stop", lambda: watcher.stop() or True)
    c.check("pause", lambda: sbx.pause() or True)
    c.check("state_paused", lambda: str(e2b.Sandbox.get_info(sbx.sandbox_id).state.value))
    c.check("connect_resumes", lambda: e2b.Sandbox.connect(sbx.sandbox_id).commands.run("echo back").stdout)
    c.check("state_running", lambda: str(e2b.Sandbox.get_info(sbx.sandbox_id).state.value))
    c.check("kill", sbx.kill)


SCENARIOS: dict[str, Callable[[dict[str, Any], Checks], None]] = {
    "terminal": scenario_terminal,
    "create": scenario_create,
    "kill": scenario_kill,
    "lifecycle": scenario_lifecycle,
    "commands": scenario_commands,
    "files": scenario_files,
    "code": scenario_code,
    "bad": scenario_bad,
    "smolagents": scenario_smolagents,
}


def main() -> int:
    scenario = SCENARIOS[sys.argv[1]]
    args = json.loads(sys.stdin.read() or "{}")
    checks = Checks()
    checks.check("versions", versions)
    scenario(args, checks)
    checks.emit({"done": True})
    return 0


def versions() -> dict[str, str]:
    import importlib.metadata as metadata

    found = {}
    for name in ("e2b", "e2b-code-interpreter", "smolagents"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


if __name__ == "__main__":
    sys.exit(main())
