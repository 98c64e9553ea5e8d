"""GitWorkspace in real sandboxes: clone, status, diff, tests, and credentials over HTTP.

The image is a :class:`~agentnest.Template` of the default base plus Debian's
``git`` (built once per spec and cached by its content hash).  Every remote
lives inside the sandbox itself: a bare repository in the workspace
(``file://``), and for credentials a small smart-HTTP server on the
sandbox's loopback (``git http-backend`` behind Basic authentication) that
also looks, while git talks to it, through every process's command line and
environment for the token.  No traffic leaves the sandbox.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest

from agentnest import ExecutionResult, MemoryObserver, Sandbox, Secret, Template
from agentnest.errors import ChannelError, ExecutionError
from agentnest.git import DiffFile, GitError, GitWorkspace, StatusEntry

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

TOKEN = "ghp-Sandb0xT0ken-7c1e9a"  # a test secret
USER = "agent-bot"

#: Creates /workspace/origin.git with two commits on main and a feature branch.
SETUP = "\n".join(
    [
        "set -e",
        "export GIT_AUTHOR_NAME=T GIT_AUTHOR_EMAIL=t@example.invalid",
        "export GIT_COMMITTER_NAME=T GIT_COMMITTER_EMAIL=t@example.invalid",
        "git init -q -b main src",
        "cd src",
        "printf 'def add(a, b):\\n    return a + b\\n' > calc.py",
        "printf 'import unittest\\nimport calc\\n\\nclass T(unittest.TestCase):\\n' > test_calc.py",
        "printf '    def test_add(self):\\n        self.assertEqual(calc.add(2, 2), 4)\\n' >> test_calc.py",
        "printf '    def test_zero(self):\\n        self.assertEqual(calc.add(0, 0), 0)\\n' >> test_calc.py",
        "git add . && git commit -q -m init",
        "echo '# calc' > README.md && git add README.md && git commit -q -m readme",
        "git checkout -q -b feature && echo x > feature.txt",
        "git add . && git commit -q -m feature && git checkout -q main",
        "cd .. && git clone -q --bare src origin.git && rm -rf src",
    ]
)

#: A smart-HTTP git server on loopback: Basic auth, then git http-backend (CGI).
#: On every request it checks every process's argv and environment for the
#: token (read from its own stdin) and appends what it saw to server.log.
SERVER = r"""
import base64, http.server, json, os, subprocess, sys
token = sys.stdin.readline().strip()
user = sys.argv[1]
log = open("/workspace/server.log", "a", buffering=1)

def leaks():
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        for part in ("cmdline", "environ"):
            try:
                with open("/proc/%s/%s" % (pid, part), "rb") as f:
                    raw = f.read()
            except OSError:
                continue
            if token.encode() in raw:
                found.append([int(pid), part])
    return found

class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def handle_one(self, method):
        expected = "Basic " + base64.b64encode(("%s:%s" % (user, token)).encode()).decode()
        auth = self.headers.get("Authorization")
        entry = {"method": method, "path": self.path, "auth": auth is not None, "ok": auth == expected,
                 "leaks": leaks()}
        log.write(json.dumps(entry) + "\n")
        if auth != expected:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="git"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path, _, query = self.path.partition("?")
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        env = dict(os.environ, GIT_PROJECT_ROOT="/workspace/srv", GIT_HTTP_EXPORT_ALL="1",
                   REQUEST_METHOD=method, PATH_INFO=path, QUERY_STRING=query, REMOTE_USER=user,
                   CONTENT_TYPE=self.headers.get("Content-Type", ""), CONTENT_LENGTH=str(len(body)))
        out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True).stdout
        head, _, payload = out.partition(b"\r\n\r\n")
        status = 200
        headers = []
        for line in head.decode().split("\r\n"):
            name, _, value = line.partition(": ")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name:
                headers.append((name, value))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self):
        self.handle_one("GET")

    def do_POST(self):
        self.handle_one("POST")

server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
print("listening", server.server_address[1], flush=True)
server.serve_forever()
"""


@pytest.fixture(scope="session")
def git_image() -> str:
    """The base image plus git: built once per spec, then found by its content-hash tag."""
    return Template(apt_packages=("git",)).build()


@pytest.fixture
def events() -> MemoryObserver:
    return MemoryObserver()


@pytest.fixture
def sandbox(git_image: str, events: MemoryObserver) -> Iterator[Sandbox]:
    with Sandbox(git_image, timeout=240, observers=[events]) as sb:
        sb.exec_shell(SETUP, timeout=60).check()
        yield sb


def test_clone_status_diff_and_tests(sandbox: Sandbox) -> None:
    repo = GitWorkspace(sandbox)
    cloned = repo.clone("file:///workspace/origin.git", depth=1)
    assert (cloned.path, cloned.branch) == ("repo", "main") and len(cloned.head) == 40
    assert sandbox.exec(["git", "-C", "repo", "rev-list", "--count", "HEAD"]).stdout.strip() == "1"  # shallow
    status = repo.status()
    assert status.clean and status.branch == "main" and status.upstream == "origin/main"
    assert status.head == cloned.head and (status.ahead, status.behind) == (0, 0)

    passing = repo.run_tests("python3 -m unittest -v")
    assert passing.ok and passing.summary == {"ran": 2, "failed": 0, "passed": 2}

    sandbox.write_file("repo/calc.py", "def add(a, b):\n    return a - b\n")
    sandbox.write_file("repo/notes/todo.txt", "fix\n")
    sandbox.exec(["git", "-C", "repo", "mv", "README.md", "README.txt"]).check()
    status = repo.status()
    assert not status.clean
    assert set(status.entries) == {
        StatusEntry("calc.py", ".", "M"),
        StatusEntry("README.txt", "R", ".", "README.md"),
        StatusEntry("notes/todo.txt", "?", "?"),
    }
    diff = repo.diff()
    assert diff.files == (DiffFile("calc.py", 1, 1),) and not diff.truncated
    assert "-    return a + b\n+    return a - b\n" in diff.text
    staged = repo.diff(staged=True)
    assert staged.files == (DiffFile("README.txt", 0, 0, "README.md"),)
    against_head = repo.diff("HEAD", paths=["calc.py"])
    assert against_head.files == (DiffFile("calc.py", 1, 1),)

    failing = repo.run_tests("python3 -m unittest")
    assert not failing.ok and failing.exit_code == 1
    assert failing.summary == {"ran": 2, "failures": 1, "failed": 1, "passed": 1}
    assert "AssertionError: 0 != 4" in failing.output

    slow = repo.run_tests("echo started; sleep 60", timeout=1)
    assert slow.timed_out and not slow.ok and "started" in slow.stdout
    assert repo.status().branch == "main"  # the sandbox lives on


def test_clone_a_branch_into_another_directory_and_failures(sandbox: Sandbox) -> None:
    repo = GitWorkspace(sandbox)
    cloned = repo.clone("/workspace/origin.git", branch="feature", dest="work/feature")
    assert cloned.branch == "feature" and repo.path == "work/feature"
    assert sandbox.read_file("work/feature/feature.txt") == "x\n"
    with pytest.raises(
        GitError, match=r"git clone failed: fatal: .*does not appear to be a git repository"
    ) as info:
        GitWorkspace(sandbox, "other").clone("file:///workspace/missing.git")
    result = info.value.result
    assert isinstance(result, ExecutionResult) and result.exit_code == 128
    with pytest.raises(GitError, match="git clone failed"):
        GitWorkspace(sandbox, "third").clone("file:///workspace/origin.git", branch="no-such-branch")
    with pytest.raises(GitError, match="git status failed"):
        GitWorkspace(sandbox, "nowhere").status()


def test_credentials_reach_git_and_nothing_else(sandbox: Sandbox, events: MemoryObserver) -> None:
    sandbox.exec_shell("mkdir -p srv && cp -r origin.git srv/private.git", timeout=30).check()
    sandbox.write_file("server.py", SERVER)
    # The server gets the token on stdin: it is in no argv or environment of its own.
    stream = sandbox.stream_exec(["python3", "server.py", USER], input=TOKEN + "\n", timeout=200)
    chunks = iter(stream)
    banner = ""
    while "\n" not in banner:
        banner += next(chunks).data
    assert banner.startswith("listening "), banner
    url = f"http://127.0.0.1:{int(banner.split()[1])}/private.git"

    def drain() -> None:
        try:
            for _ in chunks:
                pass
        except ChannelError:
            pass  # stream.close() below abandons the server's command

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    try:
        repo = GitWorkspace(sandbox)
        with pytest.raises(GitError, match="Authentication failed"):
            repo.clone(url, credentials=Secret("wrong-token-value"), username=USER, dest="denied")
        cloned = repo.clone(url, credentials=Secret(TOKEN), username=USER, dest="private")
        assert cloned.branch == "main" and sandbox.read_file("private/calc.py").startswith("def add")
        # Without credentials git may not ask anyone: it fails instead of hanging on a prompt.
        with pytest.raises(GitError):
            GitWorkspace(sandbox).clone(url, dest="anonymous")
    finally:
        stream.close()
        drainer.join(30)

    log = [json.loads(line) for line in sandbox.read_file("server.log").splitlines()]
    assert any(entry["ok"] for entry in log), (
        log
    )  # the right token reached the server through git's credential helper
    assert any(entry["auth"] and not entry["ok"] for entry in log)  # the wrong one was sent, and refused
    assert all(entry["leaks"] == [] for entry in log), log  # in no process's argv or environment
    # Nowhere in what the sandbox returns or records, nor in the clone's configuration.
    assert TOKEN not in sandbox.exec_shell("cat private/.git/config; git -C private remote -v").stdout
    assert sandbox.exec_shell("ls -d /tmp/.agentnest-git-* 2>/dev/null | wc -l").stdout.strip() == "0"
    assert TOKEN not in json.dumps([e.data for e in events.events], default=str)
    assert TOKEN not in cloned.output
    echoed = sandbox.exec_python(f"print({TOKEN!r})")
    assert echoed.stdout == "[REDACTED]\n"  # the guard redacts it from now on


def test_0_3_0_calls_keep_their_meaning(sandbox: Sandbox) -> None:
    # 0.3.0: GitWorkspace(sandbox, directory) with an absolute directory, clone(url, ref=, depth=1)
    # -> ExecutionResult, status()/diff() -> str, apply_patch(patch) -> ExecutionResult.
    repo = GitWorkspace(sandbox, "/workspace/repo03")
    assert (repo.sandbox, repo.directory, repo.path) == (sandbox, "/workspace/repo03", "repo03")
    result = repo.clone("file:///workspace/origin.git", ref="feature")
    assert isinstance(result, ExecutionResult) and result.ok and result.exit_code == 0
    assert result.check() is result and "Cloning into" in result.stderr
    assert sandbox.read_file("repo03/feature.txt") == "x\n"
    shallow = sandbox.exec(["git", "-C", "repo03", "rev-list", "--count", "HEAD"]).stdout.strip()
    assert shallow == "1"  # depth=1 by default, as in 0.3.0
    assert repo.status() == "" and repo.diff() == "" and repo.diff(staged=True) == ""

    sandbox.write_file("repo03/calc.py", "def add(a, b):\n    return a - b\n")
    sandbox.write_file("repo03/notes/todo.txt", "fix\n")
    status = repo.status()
    by_git = sandbox.exec_shell("git status --short", cwd="repo03").check().stdout
    assert status == by_git == " M calc.py\n?? notes/\n" and status.branch == "feature"
    patch = repo.diff()
    by_git = sandbox.exec_shell("git diff --no-ext-diff --", cwd="repo03").check().stdout
    assert patch == by_git and "+    return a - b" in patch and patch.files == (DiffFile("calc.py", 1, 1),)

    sandbox.exec(["git", "-C", "repo03", "checkout", "--", "calc.py"]).check()
    applied = repo.apply_patch(patch)
    assert isinstance(applied, ExecutionResult) and applied.ok
    assert repo.diff() == patch and not sandbox.exists("repo03/.agentnest.patch")
    refused = repo.apply_patch(patch)  # applied already: git refuses, and says so
    assert not refused.ok and "patch does not apply" in refused.stderr
    with pytest.raises(ExecutionError, match="patch does not apply"):  # as 0.3.0's check() did
        refused.check()
    assert repo.diff() == patch  # nothing changed

    by_keyword = GitWorkspace(sandbox, directory="/workspace/repo04")
    assert by_keyword.clone("file:///workspace/origin.git", depth=2).ok
    assert by_keyword.status().branch == "main"


@pytest.mark.gvisor
def test_gvisor_smoke(git_image: str) -> None:
    with Sandbox(git_image, timeout=120, backend="gvisor") as sb:
        sb.exec_shell(SETUP, timeout=60).check()
        repo = GitWorkspace(sb)
        # Transports (file://, http) need a thread for the sideband: threads start
        # under gVisor too (the runsc seccomp profile leaves clone3 to gVisor).
        shallow = GitWorkspace(sb, "shallow").clone("file:///workspace/origin.git", depth=1)
        assert shallow.branch == "main"
        cloned = repo.clone("/workspace/origin.git")
        assert cloned.branch == "main"
        sb.write_file("repo/calc.py", "changed\n")
        assert repo.status().entries == (StatusEntry("calc.py", ".", "M"),)
        assert repo.diff().files == (DiffFile("calc.py", 1, 2),)
        broken = repo.run_tests("python3 -m unittest")
        assert not broken.ok and broken.summary["failed"] >= 1
