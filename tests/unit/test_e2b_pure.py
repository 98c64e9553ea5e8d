"""The E2B face's pure logic: keys, users, paths, messages, command ends, watches, results, network asks."""

from __future__ import annotations

import base64
import hashlib
import json
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from agentnest.errors import ConfigurationError
from agentnest.server.e2b import state
from agentnest.server.e2b.state import Box, E2BTemplate, basic_user, e2b_key, secret_of, user_problem

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="connectrpc needs Python 3.11")


def make_box(workdir: str = "/workspace") -> Box:
    entry: Any = SimpleNamespace(
        sandbox=SimpleNamespace(id="abc123", config=SimpleNamespace(workdir=workdir))
    )
    return Box(entry, "base")


def test_keys_round_trip_and_keep_the_shape_old_sdks_demand() -> None:
    secret = "ant_abcdefghijkl_x-Y_z"
    key = e2b_key(secret)
    assert key.startswith("e2b_") and all(c in "0123456789abcdef" for c in key[4:])
    assert secret_of(key) == secret
    assert secret_of(secret) == secret  # the raw secret passes through
    assert secret_of("e2b_zz") == "e2b_zz"  # not hex: taken as it is (and fails authentication)
    assert secret_of("e2b_ff") == "e2b_ff"  # not UTF-8 once decoded


def test_users() -> None:
    header = "Basic " + base64.b64encode(b"user:").decode()
    assert basic_user(header) == "user" and user_problem("user") is None
    assert basic_user(None) is None and user_problem(None) is None
    root = basic_user("Basic " + base64.b64encode(b"root:").decode())
    assert root == "root" and "root is not available" in str(user_problem(root))
    assert "unknown user" in str(user_problem("mallory"))
    assert basic_user("Basic !!!") == "\x00invalid" and user_problem("\x00invalid") is not None


def test_paths_map_home_onto_the_workspace() -> None:
    b = make_box()
    assert b.sandbox_path(None) == "/workspace"
    assert b.sandbox_path("/home/user") == "/workspace"
    assert b.sandbox_path("a/b.txt") == "/workspace/a/b.txt"
    assert b.sandbox_path("/home/user/a/../c") == "/workspace/c"
    assert b.sandbox_path("/home/username") == "/home/username"  # a prefix is not a parent
    assert b.sandbox_path("../../etc/passwd") == "/etc/passwd"  # left for the guard to refuse
    assert b.sandbox_path("/tmp/x") == "/tmp/x"
    assert b.e2b_path("a/b.txt") == "/home/user/a/b.txt"
    assert b.e2b_path("") == "/home/user" and b.e2b_path("/workspace") == "/home/user"
    assert b.e2b_path("/workspace2/x") == "/workspace2/x"


def test_template_parsing() -> None:
    assert E2BTemplate.parse("base=pool:warm") == ("base", E2BTemplate(pool="warm"))
    assert E2BTemplate.parse("py=image:agentnest/base:1") == ("py", E2BTemplate(image="agentnest/base:1"))
    assert E2BTemplate.parse("g=image:img@gvisor") == ("g", E2BTemplate(image="img", backend="gvisor"))
    assert E2BTemplate.parse("d=default") == ("d", E2BTemplate())
    for bad in ("nameonly", "x=pool:", "x=what:y", "=pool:p"):
        with pytest.raises(ConfigurationError):
            E2BTemplate.parse(bad)
    with pytest.raises(ConfigurationError, match="not both"):
        E2BTemplate(pool="p", image="i")


def test_codec_speaks_protobuf_json() -> None:
    from connectrpc.code import Code
    from connectrpc.errors import ConnectError

    from agentnest.server.e2b import wire as w

    codec = w.JSONCodec()
    start = codec.decode(
        b'{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"1"}},"stdin":false,"x":1}',
        w.StartRequest,
    )
    assert start.process.args[-1] == "echo hi" and start.process.envs == {"A": "1"} and start.stdin is False
    data = json.loads(codec.encode(w.EventResponse(event=w.ProcessEvent(data=w.DataEvent(stdout=b"hi\n")))))
    assert data == {"event": {"data": {"stdout": base64.b64encode(b"hi\n").decode()}}}
    end = json.loads(
        codec.encode(w.EventResponse(event=w.ProcessEvent(end=w.EndEvent(exit_code=3, exited=True))))
    )
    assert end == {"event": {"end": {"exitCode": 3, "exited": True}}}
    entry = json.loads(
        codec.encode(w.EntryInfo(name="a", type="FILE_TYPE_FILE", path="/home/user/a", size=4096))
    )
    assert entry["size"] == "4096"  # int64 as a string
    sent = codec.decode(b'{"process":{"pid":7},"input":{"stdin":"aGk"}}', w.SendInputRequest)
    assert sent.input.stdin == b"hi"  # unpadded base64 accepted
    for bad, cls in (
        (b"{", w.StartRequest),
        (b'{"process":{}}', w.StartRequest),
        (b'{"process":{"pid":7},"input":{"stdin":"***"}}', w.SendInputRequest),
        (b'{"path":"x","depth":-1}', w.ListDirRequest),
    ):
        with pytest.raises(ConnectError) as info:
            codec.decode(bad, cls)
        assert info.value.code is Code.INVALID_ARGUMENT


def test_the_end_of_a_command_as_go_tells_it() -> None:
    from agentnest.server.e2b.process import _end_event

    assert _end_event(0, None, False, None).status == "exit status 0"
    three = _end_event(3, None, False, None)
    assert (three.exit_code, three.exited) == (3, True)
    killed = _end_event(137, None, False, 9)
    assert (killed.exit_code, killed.exited, killed.status) == (-1, False, "signal: killed")
    assert _end_event(137, None, False, None).status == "exit status 137"  # not ours: an exit code
    assert _end_event(None, "why", True, None).status == "signal: killed"
    lost = _end_event(None, None, False, None)
    assert lost.exit_code == -1 and lost.error


def test_watch_diff() -> None:
    from agentnest.server.e2b.watch import diff

    before = {"a": ("file", 1, 0o644, 1.0), "d": ("dir", 0, 0o755, 1.0), "gone": ("file", 1, 0o644, 1.0)}
    after = {
        "a": ("file", 2, 0o644, 2.0),
        "d": ("dir", 0, 0o700, 2.0),
        "new": ("file", 0, 0o644, 2.0),
    }
    events = {(e.name, e.type) for e in diff(before, after)}
    assert events == {
        ("a", "EVENT_TYPE_WRITE"),
        ("d", "EVENT_TYPE_CHMOD"),
        ("new", "EVENT_TYPE_CREATE"),
        ("gone", "EVENT_TYPE_REMOVE"),
    }
    assert diff(after, after) == []


def test_interpreter_results_and_errors() -> None:
    from agentnest.server.e2b.interpreter import _error, _results
    from agentnest.session import DisplayItem, SessionResult

    result = SessionResult(
        stdout="",
        stderr="",
        result="<Dot>",
        display=(
            DisplayItem("image/png", "iVBORw0KGgo="),
            DisplayItem("text/html", "<b>x</b>"),
            DisplayItem("image/png", "AAAA", result=True),
            DisplayItem("application/json", '{"a": 1}'),
            DisplayItem("application/x-custom", "z"),
        ),
    )
    docs = _results(result)
    # One result per display() call; the trailing value's rich form joins its text in the main one.
    assert docs[0] == {"type": "result", "is_main_result": False, "png": "iVBORw0KGgo="}
    assert docs[1] == {"type": "result", "is_main_result": False, "html": "<b>x</b>"}
    assert docs[2]["json"] == {"a": 1} and docs[3]["extra"] == {"application/x-custom": "z"}
    assert docs[-1] == {"type": "result", "is_main_result": True, "text": "<Dot>", "png": "AAAA"}
    assert len(docs) == 5
    err = _error(
        'Traceback (most recent call last):\n  File "<cell>", line 1\nZeroDivisionError: division by zero\n'
    )
    assert (err["name"], err["value"]) == ("ZeroDivisionError", "division by zero")
    assert _error("Traceback...\nf.<locals>.FinalAnswerException: 42")["name"] == "FinalAnswerException"
    assert _error("json.decoder.JSONDecodeError: Expecting value")["name"] == "JSONDecodeError"
    odd = _error("something went wrong without a name")
    assert odd["name"] == "Error" and odd["value"] == "something went wrong without a name"


def test_network_asks_map_onto_our_policy() -> None:
    from agentnest.server.e2b.control import ControlPlane, E2BError, NewSandbox

    plane = ControlPlane(SimpleNamespace(), SimpleNamespace(), SimpleNamespace())  # type: ignore[arg-type]
    open_token: Any = SimpleNamespace(ceiling=SimpleNamespace(network=("denied", "open", "allowlist")))
    closed_token: Any = SimpleNamespace(ceiling=SimpleNamespace(network=("denied",)))

    def ask(token: Any = open_token, **body: Any) -> Any:
        net = plane._network(NewSandbox.model_validate({"templateID": "base", **body}), token)
        return None if net is None else (net.mode, net.domains)

    assert ask() is None
    assert ask(allow_internet_access=True) == ("open", [])
    # The SDK's default ask: as much as the ceiling allows, never more.
    assert ask(closed_token, allow_internet_access=True) == ("denied", [])
    assert ask(allow_internet_access=False) == ("denied", [])
    assert ask(network={"denyOut": ["0.0.0.0/0"], "allowOut": ["pypi.org"]}) == ("allowlist", ["pypi.org"])
    with pytest.raises(E2BError, match="allowlist"):
        ask(network={"denyOut": ["10.0.0.1"]})
    with pytest.raises(E2BError, match="not supported"):
        ask(network={"rules": {"x": 1}})


def test_file_url_signatures() -> None:
    from starlette.requests import Request

    from agentnest.server.e2b.face import _signature_ok

    b = make_box()

    def signed(path: str, op: str, user: str, expiration: int | None) -> str:
        raw = f"{path}:{op}:{user}:{b.access_token}" + (f":{expiration}" if expiration is not None else "")
        return "v1_" + base64.b64encode(hashlib.sha256(raw.encode()).digest()).rstrip(b"=").decode()

    def request(method: str, query: str) -> Request:
        query = query.replace("+", "%2B")  # as a client's URL encoding sends it
        return Request(
            {
                "type": "http",
                "method": method,
                "path": "/files",
                "query_string": query.encode(),
                "headers": [],
            }
        )

    good = signed("/home/user/a", "read", "", None)
    assert _signature_ok(request("GET", f"path=/home/user/a&signature={good}"), b)
    assert not _signature_ok(
        request("POST", f"path=/home/user/a&signature={good}"), b
    )  # a read is not a write
    assert not _signature_ok(request("GET", f"path=/home/user/b&signature={good}"), b)
    expired = signed("/home/user/a", "read", "", 1)
    assert not _signature_ok(
        request("GET", f"path=/home/user/a&signature={expired}&signature_expiration=1"), b
    )
    assert not _signature_ok(request("GET", "path=/home/user/a"), b)


def test_envd_version_gates_what_the_sdk_asks() -> None:
    from packaging.version import Version

    # stdin 0.3.0, default user 0.4.0, close_stdin 0.5.2, octet-stream uploads 0.5.7: served;
    # file metadata 0.6.2: not served, so the advertised version must stay below it.
    assert Version("0.5.7") <= Version(state.ENVD_VERSION) < Version("0.6.2")


def test_templates_from_profiles_carry_what_a_server_can_apply() -> None:
    from agentnest import NetworkPolicy, SecurityPolicy
    from agentnest.approvals import ApprovalRule
    from agentnest.profiles import Profile

    net = NetworkPolicy.allowlist(domains=("pypi.org",), ports=(443,))
    profile = Profile(
        name="small",
        image="img:1",
        memory=128 << 20,
        environment={"A": "1"},
        security_policy=SecurityPolicy(network=net, max_output_bytes=1 << 20),
    )
    fields = E2BTemplate(profile=profile).create_fields()
    assert (
        fields["image"] == "img:1" and fields["memory"] == 128 << 20 and fields["environment"] == {"A": "1"}
    )
    assert fields["network"] == {
        "mode": "allowlist",
        "domains": ["pypi.org"],
        "ports": [443],
        "subdomains": True,
    }
    assert fields["policy"] == {"max_output_bytes": 1 << 20}
    assert E2BTemplate(profile=profile, backend="gvisor").create_fields()["backend"] == "gvisor"
    assert E2BTemplate(pool="warm").create_fields() == {"pool": "warm"}
    found = E2BTemplate.parse("s=profile:small", lambda name: profile)
    assert found == ("s", E2BTemplate(profile=profile))
    with pytest.raises(ConfigurationError, match="no profile file"):
        E2BTemplate.parse("s=profile:small")
    # What a server cannot apply per sandbox is refused, never silently dropped.
    ruled = Profile(name="ruled", approvals=(ApprovalRule(action="deny", kind="exec", match="rm *"),))
    with pytest.raises(ConfigurationError, match="approvals"):
        E2BTemplate(profile=ruled)
    seccomp = Profile(
        name="sc", security_policy=SecurityPolicy(seccomp_profile='{"defaultAction": "SCMP_ACT_ERRNO"}')
    )
    with pytest.raises(ConfigurationError, match="seccomp_profile"):
        E2BTemplate(profile=seccomp)
    with pytest.raises(ConfigurationError, match="not both"):
        E2BTemplate(pool="p", profile=profile)


def test_shell_escapes_as_a_notebook_kernel_runs_them() -> None:
    from agentnest.server.e2b.interpreter import shell_escapes

    plain = "x = '!not a command'\nprint(x)"
    assert shell_escapes(plain) == plain
    code = "!pip install pillow numpy\nfor i in range(2):\n    !echo $HOME\n%pip install x\ny = 1"
    out = shell_escapes(code)
    assert "_agentnest_shell_('pip install pillow numpy')" in out
    assert "    _agentnest_shell_('echo $HOME')" in out and "_agentnest_shell_('pip install x')" in out
    compile(out, "<cell>", "exec")  # valid Python now
    import contextlib
    import io

    out_buffer = io.StringIO()
    with contextlib.redirect_stdout(out_buffer):
        exec(compile(shell_escapes("!echo from-a-shell"), "<cell>", "exec"), {})
    assert out_buffer.getvalue() == "from-a-shell\n"  # the command ran in a shell, its output on stdout
    broken = "def f(:\n    pass"
    assert shell_escapes(broken) == broken  # a real syntax error stays one
