"""Snapshot, restore, fork, artifacts and download without an engine.

Three layers, each with hostile input:

* the host's rules (:class:`TarRules` behind the gate) on tars built in memory;
* the in-sandbox programs (extractor, writer, hasher) run as plain local
  subprocesses on a temporary directory, fed the same hostile tars;
* the whole flow through ``Sandbox`` on a local backend: the real agent runs
  unsandboxed in a temporary directory, so the channel, flow control and
  staging/swap run for real.

Nothing here is isolated: the hostile tars are refused before they touch
anything, and every path they aim at is inside a temporary directory.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import struct
import subprocess
import tarfile
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from doubles.local_agent import LocalBackend

from agentnest import (
    Artifact,
    ConfigurationError,
    EventType,
    FileAccessError,
    MemoryObserver,
    PolicyDeniedError,
    Sandbox,
    SandboxDestroyedError,
    SnapshotError,
    SnapshotMetadata,
    UnsupportedCapabilityError,
    state,
)
from agentnest.guard import ApprovalRequest
from agentnest.runtime.base import Capability

pytestmark = pytest.mark.timeout(120)

KEEP = b"the old contents\n"


# -- building tars in memory -----------------------------------------------------------


def info(name: str, kind: bytes = tarfile.REGTYPE, *, size: int = 0, link: str = "") -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.size = size
    ti.linkname = link
    ti.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    ti.mtime = 1_700_000_000
    return ti


def build(*members: tuple[tarfile.TarInfo, bytes | None], end: bool = True) -> bytes:
    """A PAX tar of ``members``; without ``end``, no end-of-archive marker (a writer's stream)."""
    buf = io.BytesIO()
    for ti, data in members:
        if data is not None:
            ti.size = len(data)
        buf.write(ti.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
        if data:
            buf.write(data + bytes(-len(data) % 512))
    if end:
        buf.write(bytes(1024))
    return buf.getvalue()


def root() -> tuple[tarfile.TarInfo, bytes | None]:
    return info("workspace", tarfile.DIRTYPE), None


def file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes | None]:
    return info(name), data


def sparse_member(name: str, realsize: int, segments: list[tuple[int, int]], stored: bytes) -> bytes:
    """A GNU sparse 1.0 member whose map says ``segments`` and whose data is ``stored``."""
    smap = (f"{len(segments)}\n" + "".join(f"{o}\n{n}\n" for o, n in segments)).encode()
    smap += bytes(-len(smap) % 512)
    ti = info("workspace/GNUSparseFile.0/s")
    ti.size = len(smap) + len(stored)
    ti.pax_headers = {
        "path": "workspace/GNUSparseFile.0/s",
        "GNU.sparse.major": "1",
        "GNU.sparse.minor": "0",
        "GNU.sparse.name": name,
        "GNU.sparse.realsize": str(realsize),
    }
    body = smap + stored
    return ti.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape") + body + bytes(-len(body) % 512)


def chunks(data: bytes, size: int = 7000) -> Callable[[], bytes]:
    """A source that hands out ``data`` in odd-sized chunks, as a channel would."""
    pos = [0]

    def pull() -> bytes:
        start = pos[0]
        pos[0] += size
        return data[start : start + size]

    return pull


def host_check(data: bytes, **rules: Any) -> tuple[state.TarRules, bytes]:
    """Run the host's gate and rules over a writer-style stream; return what passed."""
    passed = bytearray()
    tar_rules = state.TarRules(max_bytes=rules.pop("max_bytes", 1 << 30), **rules)
    state._read_archive(state._Gate(chunks(data), passed.extend), tar_rules, snapshot_file=False)
    return tar_rules, bytes(passed)


# -- the extractor and writer as local processes ---------------------------------------


def frames(data: bytes, piece: int = 65536) -> bytes:
    out = bytearray()
    for i in range(0, len(data), piece):
        part = data[i : i + piece]
        out += struct.pack(">I", len(part)) + part
    return bytes(out)


def extractor_args(workspace: Path, **over: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "root": str(workspace),
        "token": uuid.uuid4().hex[:12],
        "prefix": "workspace",
        "max_bytes": 1 << 30,
        "max_entries": state.MAX_ENTRIES,
        "max_file": state.MAX_FILE_SIZE,
        "ack": state.ACK_EVERY,
    }
    args.update(over)
    return args


def run_extractor(
    workspace: Path, data: bytes, *, decision: bytes = b"C", as_user: int | None = None, **over: Any
) -> tuple[int, Any]:
    """Feed ``data`` to the extractor as the host would; return (exit code, last JSON it printed)."""
    stdin = frames(data) + struct.pack(">I", 0) + decision
    proc = subprocess.run(
        state._argv(state._EXTRACTOR, extractor_args(workspace, **over)),
        input=stdin,
        capture_output=True,
        timeout=60,
        check=False,
        user=as_user,
        group=as_user,
    )
    notes = [
        json.loads(line[len(state._MARK) :])
        for line in proc.stderr.decode().splitlines()
        if line.startswith(state._MARK)
    ]
    finals = [json.loads(line) for line in proc.stdout.decode().splitlines() if line.startswith("{")]
    return proc.returncode, (notes or finals or [proc.stderr.decode()])[-1]


def run_writer(workspace: Path, sub: str = "", prefix: str = "workspace", **over: Any) -> tuple[bytes, str]:
    args = {"root": str(workspace), "sub": sub, "prefix": prefix, "max_bytes": 1 << 32}
    args["max_entries"] = state.MAX_ENTRIES
    args.update(over)
    proc = subprocess.run(state._argv(state._WRITER, args), capture_output=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, proc.stderr.decode()


def tree(path: Path) -> dict[str, Any]:
    """Everything below ``path``: kind, content or target, mode."""
    out: dict[str, Any] = {}
    for entry in sorted(path.rglob("*")):
        rel = str(entry.relative_to(path))
        st = entry.lstat()
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ("link", os.readlink(entry))
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = ("dir", stat.S_IMODE(st.st_mode))
        else:
            out[rel] = ("file", entry.read_bytes(), stat.S_IMODE(st.st_mode))
    return out


def seeded(workspace: Path) -> Path:
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "keep.txt").write_bytes(KEEP)
    return workspace


# -- hostile archives: the host's rules and the extractor's -----------------------------

LONG = "a" * 300

HOSTILE: list[tuple[str, Callable[[], bytes], str, str | None]] = [
    ("absolute", lambda: build(root(), file("/etc/agentnest-test")), "absolute", "/etc/agentnest-test"),
    ("dotdot", lambda: build(root(), file("workspace/../escape")), "dotdot", "workspace/../escape"),
    ("outside the prefix", lambda: build(root(), file("other/x")), "prefix", "other/x"),
    (
        "absolute symlink",
        lambda: build(root(), (info("workspace/l", tarfile.SYMTYPE, link="/etc"), None)),
        "symlink",
        "workspace/l",
    ),
    (
        "symlink that climbs out",
        lambda: build(root(), (info("workspace/d/l", tarfile.SYMTYPE, link="../../x"), None)),
        "symlink",
        "workspace/d/l",
    ),
    (
        "symlink with '..' after a link",
        lambda: build(
            root(),
            (info("workspace/s", tarfile.DIRTYPE), None),
            (info("workspace/s/x", tarfile.SYMTYPE, link=".."), None),
            (info("workspace/s/y", tarfile.SYMTYPE, link="x/../.."), None),
        ),
        "symlink",
        "workspace/s/y",
    ),
    (
        "member below a symlink",
        lambda: build(
            root(),
            (info("workspace/sub", tarfile.DIRTYPE), None),
            (info("workspace/l", tarfile.SYMTYPE, link="sub"), None),
            file("workspace/l/f"),
        ),
        "parent",
        "workspace/l/f",
    ),
    (
        "member below a file",
        lambda: build(root(), file("workspace/f"), file("workspace/f/g")),
        "parent",
        None,
    ),
    (
        "hardlink",
        lambda: build(
            root(), file("workspace/a"), (info("workspace/h", tarfile.LNKTYPE, link="workspace/a"), None)
        ),
        "hardlink",
        "workspace/h",
    ),
    ("char device", lambda: build(root(), (info("workspace/null", tarfile.CHRTYPE), None)), "device", None),
    ("block device", lambda: build(root(), (info("workspace/sda", tarfile.BLKTYPE), None)), "device", None),
    (
        "fifo",
        lambda: build(root(), (info("workspace/pipe", tarfile.FIFOTYPE), None)),
        "fifo",
        "workspace/pipe",
    ),
    (
        "duplicate",
        lambda: build(root(), file("workspace/a"), file("workspace/a")),
        "duplicate",
        "workspace/a",
    ),
    (
        "name too long",
        lambda: build(root(), file("workspace/" + "/".join(["b" * 200] * 25))),
        "name_length",
        None,
    ),
    ("component too long", lambda: build(root(), file(f"workspace/{LONG}")), "name_length", None),
    ("'.' component", lambda: build(root(), file("workspace/./a")), "name", "workspace/./a"),
    ("reserved name", lambda: build(root(), file("workspace/.agentnest-old-1-x")), "reserved", None),
    ("root is a file", lambda: build(file("workspace")), "root", "workspace"),
    (
        "overlapping sparse map",
        lambda: build(root(), end=False) + sparse_member("workspace/s", 4096, [(0, 10), (5, 10)], bytes(20)),
        "sparse",
        "workspace/s",
    ),
    (
        "sparse map beyond the file",
        lambda: build(root(), end=False) + sparse_member("workspace/s", 100, [(90, 20)], bytes(20)),
        "sparse",
        "workspace/s",
    ),
    (
        "sparse map claims more data than stored",
        lambda: (
            build(root(), end=False) + sparse_member("workspace/s", 1 << 20, [(0, 4096)], b"") + bytes(1024)
        ),
        "corrupt",
        "workspace/s",
    ),
    (
        "global PAX header",
        lambda: (
            tarfile.TarInfo.create_pax_global_header({"path": "workspace/evil"})
            + build(root(), file("workspace/a"))
        ),
        "global_header",
        None,
    ),
    (
        "truncated data",
        lambda: build(root(), file("workspace/big", b"z" * 5000), end=False)[:-2000],
        "truncated",
        None,
    ),
    (
        "garbage after a member",
        lambda: build(root(), file("workspace/a"), end=False) + b"\xff" * 512 + build(file("workspace/b")),
        "corrupt",
        None,
    ),
]


@pytest.mark.parametrize(("make", "rule", "member"), [pytest.param(m, r, n, id=i) for i, m, r, n in HOSTILE])
def test_the_host_refuses_hostile_archives(make: Callable[[], bytes], rule: str, member: str | None) -> None:
    data = make()
    passed = bytearray()
    with pytest.raises(SnapshotError) as caught:
        state._read_archive(
            state._Gate(chunks(data), passed.extend),
            state.TarRules(max_bytes=1 << 30),
            snapshot_file=False,
        )
    assert caught.value.rule == rule, str(caught.value)
    if member is not None:
        assert caught.value.member == member
    assert f"rule: {rule}" in str(caught.value)
    # Only a prefix went through, and nothing of a refused member: what
    # passed ends before its header (a truncated member was valid so far).
    assert data.startswith(passed)
    if rule != "truncated":
        assert len(passed) < len(data)


@pytest.mark.parametrize(("make", "rule", "member"), [pytest.param(m, r, n, id=i) for i, m, r, n in HOSTILE])
def test_the_extractor_refuses_hostile_archives_and_changes_nothing(
    tmp_path: Path, make: Callable[[], bytes], rule: str, member: str | None
) -> None:
    workspace = seeded(tmp_path / "ws")
    before = tree(workspace)
    code, note = run_extractor(workspace, make())
    assert code == 3, note
    assert note["rule"] == rule, note
    if member is not None:
        assert note["member"] == member
    assert tree(workspace) == before  # untouched, and no staging directory left
    assert not (tmp_path / "escape").exists()


def test_the_extractor_reports_a_stream_cut_short(tmp_path: Path) -> None:
    workspace = seeded(tmp_path / "ws")
    data = build(root(), file("workspace/big", b"z" * 100_000), end=False)[:-50_000]
    proc = subprocess.run(
        state._argv(state._EXTRACTOR, extractor_args(workspace)),
        input=frames(data),  # no terminator: the host went away mid-stream
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 3
    assert '"rule": "truncated"' in proc.stderr.decode()
    assert tree(workspace) == {"keep.txt": ("file", KEEP, 0o644)}


@pytest.mark.parametrize(("entries", "size", "rule"), [(5, 1 << 30, "entries"), (1000, 1000, "size")])
def test_limits_are_enforced_on_both_ends(tmp_path: Path, entries: int, size: int, rule: str) -> None:
    data = build(root(), *(file(f"workspace/f{i}", b"y" * 300) for i in range(8)))
    with pytest.raises(SnapshotError) as caught:
        host_check(data, max_entries=entries, max_bytes=size)
    assert caught.value.rule == rule
    workspace = seeded(tmp_path / "ws")
    code, note = run_extractor(workspace, data, max_entries=entries, max_bytes=size)
    assert (code, note["rule"]) == (3, rule)
    assert tree(workspace) == {"keep.txt": ("file", KEEP, 0o644)}


def test_implied_directories_count_as_entries() -> None:
    deep = "workspace/" + "/".join(f"d{i}" for i in range(10)) + "/f"
    with pytest.raises(SnapshotError) as caught:
        host_check(build(root(), file(deep)), max_entries=5)
    assert caught.value.rule == "entries"


def test_the_host_holds_back_at_most_a_bounded_header() -> None:
    ti = info("workspace/a")
    ti.pax_headers = {"comment": "c" * (state.HOLD_LIMIT + 10)}
    data = build(root(), (ti, b"1"))
    with pytest.raises(SnapshotError) as caught:
        host_check(data)
    assert caught.value.rule == "header"


def test_an_allowed_archive_passes_every_byte() -> None:
    data = build(
        root(),
        (info("workspace/d", tarfile.DIRTYPE), None),
        file("workspace/d/a", b"hello"),
        (info("workspace/d/l", tarfile.SYMTYPE, link="a"), None),
        (info("workspace/d/e/up", tarfile.SYMTYPE, link="../../d/a"), None),
        end=False,
    )
    rules, passed = host_check(data)
    assert passed == data
    assert (rules.files, rules.size, rules.entries) == (1, 5, 6)  # d/e is implied


@pytest.mark.parametrize(
    ("link", "target", "ok"),
    [
        (["a"], "b", True),
        (["a"], "./b/c", True),
        (["d", "a"], "../b", True),
        (["d", "e", "a"], "../../b/c", True),
        (["a"], "../b", False),
        (["d", "a"], "../../b", False),
        (["d", "e", "a"], "../../../b", False),
        (["d", "a"], "x/../../b", False),
        (["d", "a"], "../x/..", False),
        (["a"], "/etc/passwd", False),
        (["a"], "", False),
        (["a"], "b\x00", False),
    ],
)
def test_symlink_rule(link: list[str], target: str, ok: bool) -> None:
    assert state.symlink_target_ok(link, target) is ok


@pytest.mark.parametrize(
    ("pattern", "base", "matches", "misses"),
    [
        ("**/*", "", ["a", "x/y/z.txt", ".hidden"], []),
        ("*.py", "", ["main.py", ".x.py"], ["src/main.py", "main.pyc"]),
        ("output/**/*", "output", ["output/a", "output/x/y.csv"], ["outputs/a", "a/output/b"]),
        (
            "src/*/test_?.py",
            "src",
            ["src/pkg/test_a.py"],
            ["src/test_a.py", "src/a/b/test_a.py", "src/p/test_ab.py"],
        ),
        ("data/[ab]*.csv", "data", ["data/a1.csv", "data/b.csv"], ["data/c.csv"]),
        ("data/[!ab]*", "data", ["data/c"], ["data/a", "data/b/c"]),
        ("**/report.csv", "", ["report.csv", "a/b/report.csv"], ["a/report.csv.bak"]),
        ("a[b", "", ["a[b"], ["ab"]),
    ],
)
def test_glob_to_regex(pattern: str, base: str, matches: list[str], misses: list[str]) -> None:
    import re

    got_base, regex = state.glob_to_regex(pattern)
    assert got_base == base
    rx = re.compile(regex, re.S)
    for path in matches:
        assert rx.fullmatch(path), (pattern, path)
    for path in misses:
        assert not rx.fullmatch(path), (pattern, path)


@pytest.mark.parametrize("pattern", ["", "../x", "a/../../b", "x" * 5000])
def test_glob_refuses_climbing_patterns(pattern: str) -> None:
    with pytest.raises(ConfigurationError):
        state.glob_to_regex(pattern)


# -- the writer --------------------------------------------------------------------------


def sparse_supported(path: Path) -> bool:
    probe = path / ".probe"
    with open(probe, "wb") as f:
        f.truncate(16 << 20)
    ok = probe.stat().st_blocks * 512 < 1 << 20
    probe.unlink()
    return ok


def make_tree(workspace: Path) -> None:
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "src").mkdir()
    (workspace / "src" / "main.py").write_text("print('hi')\n")
    (workspace / "src" / "run.sh").write_text("#!/bin/sh\n")
    (workspace / "src" / "run.sh").chmod(0o755)
    (workspace / "empty").mkdir()
    (workspace / "ünïcode ✓.txt").write_bytes(b"\x00\x01binary")
    (workspace / "link").symlink_to("src/main.py")
    (workspace / "src" / "up").symlink_to("../link")
    with open(workspace / "sparse.img", "wb") as f:
        f.truncate(64 << 20)
        f.seek(10 << 20)
        f.write(b"middle")
        f.seek((64 << 20) - 3)
        f.write(b"end")


def test_the_writer_archives_a_tree_the_host_accepts(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    make_tree(workspace)
    os.mkfifo(workspace / "fifo")
    data, stderr = run_writer(workspace)
    rules, _ = host_check(data)
    assert rules.files == 4
    assert rules.size == (64 << 20) + len("print('hi')\n") + len("#!/bin/sh\n") + len(b"\x00\x01binary")
    # The FIFO is left out and reported, never opened (it would block).
    assert '"skipped": ["workspace/fifo"]' in stderr
    with tarfile.open(fileobj=io.BytesIO(data + bytes(1024))) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["workspace/link"].linkname == "src/main.py"
    assert members["workspace/src/run.sh"].mode == 0o755
    assert members["workspace/sparse.img"].size == 64 << 20
    if sparse_supported(tmp_path):
        # Only the data of the sparse file is in the stream.
        assert members["workspace/sparse.img"].sparse is not None
        assert len(data) < 1 << 20


def test_the_writer_finds_holes_by_reading_when_seek_hole_is_missing(tmp_path: Path) -> None:
    # gVisor has no SEEK_HOLE and reports every block allocated: the writer
    # then reads the file and treats 64 KiB runs of zeros as holes.
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with open(workspace / "z.bin", "wb") as f:
        f.write(bytes(1 << 20) + b"data" + bytes(1 << 20))
    writer = state._source(state._WRITER)
    code = writer.replace("os.lseek(fd, 0, os.SEEK_HOLE)\n", "raise OSError(22, 'no SEEK_HOLE')\n", 1)
    assert code != writer
    args = {"root": str(workspace), "sub": "", "prefix": "workspace", "max_bytes": 1 << 30, "max_entries": 10}
    proc = subprocess.run(
        ["python3", "-I", "-S", "-c", code, json.dumps(args)], capture_output=True, check=True
    )
    with tarfile.open(fileobj=io.BytesIO(proc.stdout + bytes(1024))) as tar:
        member = tar.getmember("workspace/z.bin")
        assert cast(Any, member.sparse) == [(1 << 20, 65536), ((2 << 20) + 4, 0)]
        reader = tar.extractfile(member)
        assert reader is not None
        assert reader.read() == bytes(1 << 20) + b"data" + bytes(1 << 20)
    assert len(proc.stdout) < 100_000


def test_writer_and_extractor_round_trip_a_tree(tmp_path: Path) -> None:
    source = tmp_path / "src"
    make_tree(source)
    data, _ = run_writer(source)
    target = seeded(tmp_path / "dst")
    code, final = run_extractor(target, data + bytes(1024))
    assert code == 0, final
    assert final["ok"] is True and final["files"] == 4
    assert tree(target) == tree(source)  # keep.txt is gone: the contents were replaced
    if sparse_supported(tmp_path):
        assert (target / "sparse.img").stat().st_blocks * 512 < 1 << 20
    assert (target / "src" / "main.py").stat().st_mtime == int((source / "src" / "main.py").stat().st_mtime)


def test_an_abort_leaves_the_workspace_alone(tmp_path: Path) -> None:
    source = tmp_path / "src"
    make_tree(source)
    data, _ = run_writer(source)
    target = seeded(tmp_path / "dst")
    code, note = run_extractor(target, data + bytes(1024), decision=b"A")
    assert (code, note["rule"]) == (3, "aborted")
    assert tree(target) == {"keep.txt": ("file", KEEP, 0o644)}


def test_read_only_directories_restore_and_swap(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # Moving a directory to another parent needs write access to it, and
    # removing files needs write access to their directory: read-only
    # directories, new and old, must not break the swap.  Root ignores
    # permissions, so as root the extractor runs as the sandbox user.
    user = 65532 if os.geteuid() == 0 else None
    if user is not None:
        # pytest's own temporary root is private to root: work where the user can reach.
        tmp_path = Path(tempfile.mkdtemp(prefix="agentnest-test-"))
        request.addfinalizer(lambda: shutil.rmtree(tmp_path, ignore_errors=True))
        os.chmod(tmp_path, 0o755)
    source = tmp_path / "src"
    (source / "ro" / "sub").mkdir(parents=True)
    (source / "ro" / "sub" / "f").write_text("x")
    (source / "ro" / "sub").chmod(0o555)
    (source / "ro").chmod(0o555)
    data, _ = run_writer(source)
    target = seeded(tmp_path / "dst")
    (target / "old-ro" / "deep").mkdir(parents=True)
    (target / "old-ro" / "deep" / "g").write_text("old")
    (target / "old-ro" / "deep").chmod(0o555)
    (target / "old-ro").chmod(0o555)
    if user is not None:
        for path in [target, *target.rglob("*")]:
            os.chown(path, user, user, follow_symlinks=False)
    code, final = run_extractor(target, data + bytes(1024), as_user=user)
    assert code == 0, final
    assert stat.S_IMODE((target / "ro").stat().st_mode) == 0o555
    assert stat.S_IMODE((target / "ro" / "sub").stat().st_mode) == 0o555
    assert (target / "ro" / "sub" / "f").read_text() == "x"
    assert sorted(os.listdir(target)) == ["ro"]  # old files and the trash are gone


# -- whole flows through Sandbox on a local backend -------------------------------------


class Env:
    """Sandboxes on the local backend, their events and approvals."""

    def __init__(self, tmp: Path, caps: frozenset[Capability] | None = None) -> None:
        self.tmp = tmp
        (tmp / "boxes").mkdir()
        self.backend = LocalBackend(tmp / "boxes", caps)
        self.events = MemoryObserver()
        self.approvals: list[ApprovalRequest] = []
        self.deny: set[str] = set()
        self.made: list[Sandbox] = []

    def hook(self, request: ApprovalRequest) -> bool:
        self.approvals.append(request)
        return request.kind not in self.deny

    def sandbox(self, **kw: Any) -> Sandbox:
        sb = Sandbox(
            "local-image",
            timeout=120,
            backend=self.backend,
            observers=[self.events],
            approval_hook=self.hook,
            **kw,
        )
        self.made.append(sb)
        return sb

    def ws(self, sb: Sandbox) -> Path:
        return self.tmp / "boxes" / sb.id

    def kinds(self) -> list[str]:
        return [a.kind for a in self.approvals]

    def close(self) -> None:
        for sb in self.made:
            sb.destroy()


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    try:
        yield e
    finally:
        e.close()


def metadata_offset(data: bytes) -> int:
    """Where the metadata member's header starts (its name field opens the block)."""
    return data.index(state.METADATA_NAME.encode().ljust(100, b"\0"))


def test_snapshot_and_restore_round_trip(env: Env) -> None:
    sb = env.sandbox()
    workspace = env.ws(sb)
    make_tree(workspace)
    original = tree(workspace)
    path = env.tmp / "snap.tar"
    meta = sb.snapshot(path)
    assert isinstance(meta, SnapshotMetadata)
    assert (meta.image, meta.sandbox_id, meta.files, meta.path) == ("local-image", sb.id, 4, path)
    expected = (64 << 20) + len("print('hi')\n") + len("#!/bin/sh\n") + len(b"\x00\x01binary")
    assert meta.workspace_size == expected
    # 0.3.0's meaning: size and sha256 describe the file as stored.
    raw = path.read_bytes()
    assert (meta.size, meta.sha256) == (len(raw), hashlib.sha256(raw).hexdigest())
    assert meta.created_at == meta.created > 0
    assert [n for n in os.listdir(env.tmp) if n.startswith(".snap")] == []  # temporary file renamed
    # A plain tar whose last member is the metadata, hashing everything before it.
    with tarfile.open(path) as tar:
        assert tar.getnames()[-1] == state.METADATA_NAME
        assert tar.getnames()[0] == "workspace"
        reader = tar.extractfile(state.METADATA_NAME)
        assert reader is not None
        doc = json.load(reader)
    assert doc["sha256"] == meta.payload_sha256 == hashlib.sha256(raw[: metadata_offset(raw)]).hexdigest()
    assert doc["version"] == state.FORMAT_VERSION
    assert len(raw) % tarfile.RECORDSIZE == 0
    assert state.read_snapshot(path) == meta

    (workspace / "src" / "main.py").write_text("changed")
    (workspace / "new.txt").write_text("new")
    restored = sb.restore(path)
    assert restored == meta
    assert tree(workspace) == original
    assert [n for n in os.listdir(workspace) if n.startswith(".agentnest-")] == []
    assert env.kinds().count("snapshot") == 1 and env.kinds().count("restore") == 1
    assert "snapshot.created" in env.events.types() and "snapshot.restored" in env.events.types()


def test_compressed_snapshots_round_trip(env: Env) -> None:
    sb = env.sandbox()
    workspace = env.ws(sb)
    (workspace / "a.txt").write_text("compress me " * 1000)
    path = env.tmp / "snap.tar.gz"
    meta = sb.snapshot(path, compress=True)
    assert meta.compressed
    raw = path.read_bytes()
    assert raw[:2] == b"\x1f\x8b"
    assert (meta.size, meta.sha256) == (len(raw), hashlib.sha256(raw).hexdigest())
    assert meta.size < 2000
    (workspace / "a.txt").unlink()
    assert sb.restore(path) == meta
    assert state.read_snapshot(path) == meta
    assert (workspace / "a.txt").read_text() == "compress me " * 1000


def test_tampered_snapshots_are_refused_and_the_workspace_stays(env: Env) -> None:
    sb = env.sandbox()
    workspace = env.ws(sb)
    (workspace / "data.txt").write_text("payload " * 500)
    good = env.tmp / "good.tar"
    sb.snapshot(good)
    raw = good.read_bytes()
    at = metadata_offset(raw)
    cases = {
        "checksum": raw.replace(b"payload payload", b"PAYLOAD payload", 1),
        "truncated": raw[: at + 700],
        "metadata": raw[:at] + state._metadata_member({"format": "other", "version": 1, "created": 0}, at),
        "corrupt": raw[:at] + b"\x01" * 512 + raw[at:],
    }
    (workspace / "data.txt").write_text("current")
    (workspace / "other").write_text("still here")
    before = tree(workspace)
    for rule, data in cases.items():
        bad = env.tmp / f"{rule}.tar"
        bad.write_bytes(data)
        with pytest.raises(SnapshotError) as caught:
            state.read_snapshot(bad)
        assert caught.value.rule == rule, (rule, str(caught.value))
        with pytest.raises(SnapshotError) as caught:
            sb.restore(bad)
        assert caught.value.rule == rule, (rule, str(caught.value))
        assert tree(workspace) == before, rule
    gz = env.tmp / "cut.tar.gz"
    gz.write_bytes(gzip.compress(raw)[:-100])
    with pytest.raises(SnapshotError) as caught:
        sb.restore(gz)
    assert caught.value.rule == "truncated"
    junk = env.tmp / "junk.tar"
    junk.write_bytes(b"\x07" + os.urandom(4095))
    with pytest.raises(SnapshotError) as caught:
        sb.restore(junk)
    assert caught.value.rule == "corrupt"
    assert tree(workspace) == before
    assert sb.exec_shell("echo alive").stdout == "alive\n"


def test_the_extractor_refuses_what_the_host_let_through(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # Switch the host's rules off: the extractor in the sandbox must still refuse.
    sb = env.sandbox()
    workspace = env.ws(sb)
    (workspace / "keep.txt").write_bytes(KEEP)
    payload = build(root(), file("workspace/ok", b"fine"), file("/tmp/agentnest-evil"), end=False)
    doc = {
        "format": state.FORMAT_NAME,
        "version": 1,
        "created": 0,
        "image": "local-image",
        "sandbox_id": "x",
        "skipped": [],
        "sha256": hashlib.sha256(payload).hexdigest(),
        "files": 0,
        "entries": 0,
        "size": 0,
    }
    path = env.tmp / "evil.tar"
    path.write_bytes(payload + state._metadata_member(doc, len(payload)))
    monkeypatch.setattr(state.TarRules, "check", lambda self, m, span: (m.name.split("/")[1:], "file"))
    with pytest.raises(SnapshotError) as caught:
        sb.restore(path)
    assert (caught.value.rule, caught.value.member) == ("absolute", "/tmp/agentnest-evil")
    assert tree(workspace) == {"keep.txt": ("file", KEEP, 0o644)}
    assert not Path("/tmp/agentnest-evil").exists()


def test_plain_tars_without_metadata_are_accepted(env: Env, tmp_path: Path) -> None:
    # A 0.3.0 snapshot is a plain tar of workspace/: every member is checked
    # and the end-of-archive marker is required, but there is no checksum.
    sb = env.sandbox()
    (env.ws(sb) / "old").write_text("old")
    path = tmp_path / "plain.tar"
    path.write_bytes(build(root(), file("workspace/a.txt", b"from 0.3.0")))
    meta = sb.restore(path)
    assert (meta.image, meta.payload_sha256, meta.files) == ("", "", 1)
    assert meta.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert tree(env.ws(sb)) == {"a.txt": ("file", b"from 0.3.0", 0o644)}
    cut = tmp_path / "cut.tar"
    cut.write_bytes(build(root(), file("workspace/a.txt", b"x"), end=False))
    with pytest.raises(SnapshotError) as caught:
        sb.restore(cut)
    assert caught.value.rule == "truncated"
    assert tree(env.ws(sb)) == {"a.txt": ("file", b"from 0.3.0", 0o644)}


def test_a_newer_format_is_refused_by_name(tmp_path: Path) -> None:
    doc = {"format": state.FORMAT_NAME, "version": state.FORMAT_VERSION + 1, "created": 0}
    payload = build(root(), end=False)
    path = tmp_path / "future.tar"
    path.write_bytes(payload + state._metadata_member(doc, len(payload)))
    with pytest.raises(SnapshotError) as caught:
        state.read_snapshot(path)
    assert caught.value.rule == "version"
    assert "upgrade agentnest" in str(caught.value)


def test_restore_refuses_fifos_and_directories(env: Env, tmp_path: Path) -> None:
    sb = env.sandbox()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path):
        with pytest.raises(SnapshotError) as caught:
            sb.restore(path)
        assert caught.value.rule == "io"


def test_snapshot_of_a_workspace_with_a_link_out_is_refused(env: Env) -> None:
    sb = env.sandbox()
    workspace = env.ws(sb)
    (workspace / "ok.txt").write_text("x")
    (workspace / "python").symlink_to("/usr/bin/python3")
    with pytest.raises(SnapshotError) as caught:
        sb.snapshot(env.tmp / "s.tar")
    assert (caught.value.rule, caught.value.member) == ("symlink", "workspace/python")
    assert [n for n in os.listdir(env.tmp) if "s.tar" in n] == []  # no partial file left


def test_fork_copies_the_workspace_and_then_diverges(env: Env) -> None:
    parent = env.sandbox(environment={"TOKEN": "t"}, memory="600m", cpus=0.5, pids=100)
    pdir = env.ws(parent)
    make_tree(pdir)
    child = parent.fork()
    env.made.append(child)
    cdir = env.ws(child)
    assert child.id != parent.id and cdir != pdir
    assert tree(cdir) == tree(pdir)
    (cdir / "src" / "main.py").write_text("child")
    (pdir / "only-parent").write_text("p")
    assert (pdir / "src" / "main.py").read_text() == "print('hi')\n"
    assert not (cdir / "only-parent").exists()
    assert child.config.image == parent.config.image
    assert child.config.limits == parent.config.limits
    assert dict(child.config.environment) == {"TOKEN": "t"}
    assert child.config.lifetime == parent.config.lifetime
    forked = [e for e in env.events.events if e.type is EventType.SANDBOX_FORKED]
    assert {e.sandbox_id for e in forked} == {parent.id, child.id}
    assert [e.data["child"] for e in forked if e.sandbox_id == parent.id] == [child.id]
    assert "fork" in env.kinds()
    short = parent.fork(timeout=30)
    env.made.append(short)
    assert short.config.lifetime == 30


def test_the_child_redacts_the_parents_secrets(env: Env) -> None:
    from agentnest import Secret

    parent = env.sandbox()
    parent.exec_shell('echo "$K" > leaked.txt', env={"K": Secret("hush-hush-1234")})
    child = parent.fork()
    env.made.append(child)
    assert child.read_file("leaked.txt") == "[REDACTED]\n"


def test_fork_of_a_destroyed_sandbox(env: Env) -> None:
    parent = env.sandbox()
    parent.destroy()
    created = list(env.backend.created)
    with pytest.raises(SandboxDestroyedError):
        parent.fork()
    assert env.backend.created == created


def test_fork_and_snapshot_need_the_capabilities(tmp_path: Path) -> None:
    e = Env(
        tmp_path,
        frozenset({Capability.NETWORK_DENIED, Capability.RESOURCE_LIMITS, Capability.READ_ONLY_ROOT}),
    )
    sb = e.sandbox()
    try:
        with pytest.raises(UnsupportedCapabilityError):
            sb.fork()
        with pytest.raises(UnsupportedCapabilityError):
            sb.snapshot(tmp_path / "s.tar")
        with pytest.raises(UnsupportedCapabilityError):
            sb.restore(tmp_path / "s.tar")
        assert e.backend.created == [sb.id]
        assert not (tmp_path / "s.tar").exists()
    finally:
        e.close()


@pytest.mark.parametrize("kind", ["fork", "snapshot", "restore"])
def test_approvals_gate_state_operations(env: Env, kind: str) -> None:
    sb = env.sandbox()
    (env.ws(sb) / "a").write_text("1")
    path = env.tmp / "s.tar"
    sb.snapshot(path)
    (env.ws(sb) / "a").write_text("2")
    env.deny = {kind}
    created = list(env.backend.created)
    calls: dict[str, Callable[[], object]] = {
        "fork": sb.fork,
        "snapshot": lambda: sb.snapshot(env.tmp / "t.tar"),
        "restore": lambda: sb.restore(path),
    }
    with pytest.raises(PolicyDeniedError):
        calls[kind]()
    assert env.backend.created == created
    assert not (env.tmp / "t.tar").exists()
    assert (env.ws(sb) / "a").read_text() == "2"
    assert "policy.denied" in env.events.types()


def test_a_failed_fork_destroys_the_child(env: Env) -> None:
    parent = env.sandbox()
    (env.ws(parent) / "bad").symlink_to("/etc")
    with pytest.raises(SnapshotError) as caught:
        parent.fork()
    assert caught.value.rule == "symlink"
    child_id = env.backend.created[-1]
    assert child_id != parent.id
    assert child_id not in env.backend.agents  # destroyed
    assert parent.exec_shell("echo ok").stdout == "ok\n"


def test_parallel_forks_of_one_parent(env: Env) -> None:
    parent = env.sandbox()
    for i in range(20):
        (env.ws(parent) / f"f{i}").write_bytes(os.urandom(50_000))
    expected = tree(env.ws(parent))
    children: list[Sandbox] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def one() -> None:
        try:
            child = parent.fork()
            with lock:
                children.append(child)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(100)
    env.made.extend(children)
    assert not errors, errors
    assert len({c.id for c in children}) == 8
    for child in children:
        assert tree(env.ws(child)) == expected


def test_artifacts_hash_matching_regular_files(env: Env) -> None:
    sb = env.sandbox()
    workspace = env.ws(sb)
    (workspace / "output" / "deep").mkdir(parents=True)
    (workspace / "output" / "a.csv").write_text("1,2\n")
    (workspace / "output" / "deep" / "b.csv").write_bytes(b"\x00" * 10)
    (workspace / "output" / "link.csv").symlink_to("a.csv")
    (workspace / "top.csv").write_text("top")
    found = sb.artifacts("output/**/*.csv")
    assert found == (
        Artifact("output/a.csv", 4, hashlib.sha256(b"1,2\n").hexdigest()),
        Artifact("output/deep/b.csv", 10, hashlib.sha256(b"\x00" * 10).hexdigest()),
    )
    assert {a.path for a in sb.artifacts()} == {"output/a.csv", "output/deep/b.csv", "top.csv"}
    assert [a.path for a in sb.artifacts("/workspace/*.csv")] == ["top.csv"]
    assert sb.artifacts("missing/**/*") == ()


def test_artifacts_are_a_sorted_tuple_as_in_0_3_0(env: Env) -> None:
    sb = env.sandbox()
    for i in reversed(range(30)):
        (env.ws(sb) / f"f{i:02}").write_text(str(i))
    found = sb.artifacts("f*")
    assert isinstance(found, tuple)
    assert [a.path for a in found] == [f"f{i:02}" for i in range(30)]
    for bad in ("", "../x", "a/../../b", "/etc/*"):
        with pytest.raises(ValueError):  # ConfigurationError, as 0.3.0 raised ValueError
            sb.artifacts(bad)


def test_download_copies_files_and_trees_and_refuses_links(env: Env, tmp_path: Path) -> None:
    sb = env.sandbox()
    workspace = env.ws(sb)
    (workspace / "out" / "sub").mkdir(parents=True)
    (workspace / "out" / "sub" / "r.txt").write_text("result")
    (workspace / "out" / "tool").write_text("#!/bin/sh\n")
    (workspace / "out" / "tool").chmod(0o4777)  # setuid and world-writable in the sandbox
    dest = tmp_path / "dest"
    assert sb.download("out", dest) == dest / "out"
    assert (dest / "out" / "sub" / "r.txt").read_text() == "result"
    assert stat.S_IMODE((dest / "out" / "tool").stat().st_mode) == 0o755  # never setuid on the host
    assert sb.download("out/sub/r.txt", dest / "one") == dest / "one" / "r.txt"
    assert (dest / "one" / "r.txt").read_text() == "result"
    (workspace / "out" / "sub" / "r.txt").write_text("newer")
    sb.download("out/sub/r.txt", dest / "one")  # overwrites
    assert (dest / "one" / "r.txt").read_text() == "newer"
    assert sb.download(".", dest / "all") == dest / "all"
    assert (dest / "all" / "out" / "sub" / "r.txt").read_text() == "newer"

    (workspace / "out" / "sub" / "l").symlink_to("r.txt")
    with pytest.raises(FileAccessError) as caught:
        sb.download("out", dest / "again")
    assert caught.value.code == "link"
    with pytest.raises(FileAccessError) as missing:
        sb.download("nope", dest)
    assert missing.value.code == "not_found"
    with pytest.raises(FileAccessError):
        sb.download("../outside", dest)


def test_download_never_writes_through_a_link_in_the_destination(env: Env, tmp_path: Path) -> None:
    sb = env.sandbox()
    workspace = env.ws(sb)
    (workspace / "out").mkdir()
    (workspace / "out" / "f").write_text("payload")
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "out").symlink_to(outside)
    with pytest.raises(FileAccessError) as caught:
        sb.download("out", dest)
    assert caught.value.code == "symlink"
    assert list(outside.iterdir()) == []
    # A link at the file's own name is replaced, not written through.
    (workspace / "f2").write_text("mine")
    (dest / "f2").symlink_to(outside / "victim")
    sb.download("f2", dest)
    assert not (dest / "f2").is_symlink() and (dest / "f2").read_text() == "mine"
    assert not (outside / "victim").exists()


def test_from_snapshot_creates_and_restores(env: Env) -> None:
    sb = env.sandbox()
    (env.ws(sb) / "keep").write_text("me")
    path = env.tmp / "s.tar"
    sb.snapshot(path)
    fresh = Sandbox.from_snapshot(path, backend=env.backend)
    env.made.append(fresh)
    assert fresh.config.image == "local-image"
    assert (env.ws(fresh) / "keep").read_text() == "me"
    other = Sandbox.from_snapshot(path, image="other-image", backend=env.backend)
    env.made.append(other)
    assert other.config.image == "other-image"
    assert (env.ws(other) / "keep").read_text() == "me"


def test_from_snapshot_of_a_bad_file_creates_nothing(env: Env) -> None:
    bad = env.tmp / "bad.tar"
    bad.write_bytes(build(root(), file("/abs")))
    with pytest.raises(SnapshotError):
        Sandbox.from_snapshot(bad, backend=env.backend)
    assert env.backend.created == []


def test_the_stream_into_the_extractor_is_flow_controlled(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # With a small window the host must wait for acknowledgements many times,
    # and never has more than a window and a frame in flight.
    monkeypatch.setattr(state.programs, "ACK_WINDOW", 64 * 1024)
    monkeypatch.setattr(state.programs, "ACK_EVERY", 16 * 1024)
    sb = env.sandbox()
    data = os.urandom(3 << 20)
    (env.ws(sb) / "blob").write_bytes(data)
    path = env.tmp / "s.tar"
    sb.snapshot(path)
    (env.ws(sb) / "blob").unlink()
    in_flight: list[int] = []
    original = state._Feeder._pump

    def counting(self: state._Feeder) -> bool:
        in_flight.append(self.sent - self.acked)
        return original(self)

    monkeypatch.setattr(state._Feeder, "_pump", counting)
    sb.restore(path)
    assert (env.ws(sb) / "blob").read_bytes() == data
    assert len(in_flight) > 10
    assert max(in_flight) <= 64 * 1024 + state._PIECE + 4
