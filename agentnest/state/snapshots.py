"""Snapshot, restore and snapshot files: see :meth:`Sandbox.snapshot` and :meth:`Sandbox.restore`."""

from __future__ import annotations

import contextlib
import gzip
import os
import stat
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from ..config import SnapshotMetadata, format_size
from ..errors import SnapshotError
from ..events import EventType
from ..runtime import renameat2
from ..runtime.base import Capability
from .archive import (
    _Digest,
    _Gate,
    _HashingFile,
    _metadata,
    _metadata_member,
    _open_snapshot,
    _read_snapshot_file,
    _SnapshotFile,
)
from .host import LIVE_READ_MAX, _frozen_live, _snapshot_view, _start_extractor, _start_writer
from .programs import _read_program, _require, _writer_args
from .rules import FORMAT_NAME, FORMAT_VERSION, MAX_FILE_SIZE, MiB, TarRules

if TYPE_CHECKING:
    from .._core import SandboxCore


def snapshot(
    sandbox: SandboxCore, path: str | os.PathLike[str], *, compress: bool = False
) -> SnapshotMetadata:
    """Write the workspace to ``path`` as a snapshot tar.  See :meth:`Sandbox.snapshot`."""
    sandbox.link()  # raises SandboxDestroyedError first
    _require(sandbox, Capability.SNAPSHOT, "snapshots")
    target = Path(os.fspath(path))
    guard = sandbox.guard
    guard.approve("snapshot", {"path": str(target), "compress": bool(compress)})
    created = time.time()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)  # as 0.3.0 did
    except OSError as exc:
        raise SnapshotError(f"cannot create {str(target.parent)!r}: {exc.strerror}", rule="io") from None
    # Written beside the target and renamed over it: a reader never sees half a snapshot.
    tmp = target.with_name(f".{target.name}.agentnest-{os.getpid()}-{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with open(fd, "wb", buffering=MiB) as raw:
            # Fast path, small workspace: read on the host with the sandbox
            # frozen throughout; past LIVE_READ_MAX (or when the workspace is
            # known to be larger), from a copy-on-write snapshot taken while
            # it was frozen for an instant.
            used = sandbox.backend.workspace_usage(sandbox.handle)
            live, in_process = used is not None and used <= LIVE_READ_MAX, True
            while True:
                try:
                    doc, whole = _write_snapshot(
                        sandbox, raw, created, compress, live=live, in_process=in_process
                    )
                    break
                except SnapshotError as exc:
                    # Larger than it looked: from a snapshot; deeper than this
                    # interpreter recurses: the writer as its own process.
                    if exc.rule == "budget" and live:
                        live = False
                    elif exc.rule == "depth" and in_process:
                        in_process = False
                    else:
                        raise
                raw.seek(0)
                raw.truncate()
            size = os.fstat(fd).st_size
        _replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    meta = _metadata(doc, target, size, whole, compress)
    guard.emit(
        EventType.SNAPSHOT_CREATED,
        {"path": str(target), "sha256": meta.sha256, "size": meta.size, "files": meta.files},
    )
    return meta


def _write_snapshot(
    sandbox: SandboxCore, raw: IO[bytes], created: float, compress: bool, *, live: bool, in_process: bool
) -> tuple[dict[str, Any], str]:
    """The workspace as a snapshot file into ``raw``; returns (metadata, the file's sha256)."""
    digest = _Digest(threaded=True)  # the payload, then (uncompressed) the rest of the file
    try:
        hashing = _HashingFile(raw) if compress else None
        out: IO[bytes] = (
            cast(
                IO[bytes],
                gzip.GzipFile(fileobj=cast(IO[bytes], hashing), mode="wb", compresslevel=6, mtime=0),
            )
            if compress
            else raw
        )

        def sink(data: memoryview) -> None:
            digest.update(data)
            out.write(data)

        with _snapshot_view(sandbox, live=live) as (local, budget):
            args = _writer_args(sandbox)
            if budget is not None:
                args["budget"] = budget
            writer = _start_writer(sandbox, args, local, in_process=in_process)
            try:
                rules = TarRules(max_bytes=sandbox.config.limits.workspace)
                stream = _read_program(writer, _Gate(writer.pull, sink), rules)
                writer.check("the snapshot writer")
            except BaseException:
                writer.cancel()
                raise
        doc = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "image": sandbox.config.image,
            "created": created,
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created)),
            "sandbox_id": sandbox.id,
            "workdir": sandbox.config.workdir,
            "files": rules.files,
            "entries": rules.entries,
            "size": rules.size,
            "stored": rules.stored,
            "sha256": digest.mark(),
            "skipped": writer.skipped(),
        }
        tail = _metadata_member(doc, stream.payload)
        out.write(tail)
        digest.update(tail)
        if compress:
            out.close()
        raw.flush()
        whole = hashing.hash.hexdigest() if hashing is not None else digest.hexdigest()
    finally:
        digest.close()
    return doc, whole


def _replace(tmp: Path, target: Path) -> None:
    """Put ``tmp`` at ``target`` atomically: a reader sees the old file or the new one, whole.

    Over an existing file, the two are exchanged (``renameat2(RENAME_EXCHANGE)``)
    and the old one unlinked, rather than renamed over: ext4 writes back a
    file's data before a rename over another file returns (its
    ``auto_da_alloc`` guard for programs that never fsync), 60-80 ms for 100 MiB
    here.  Snapshots are not fsynced either way: a crash of the host can lose
    the newest one, never leave a torn file that passes :func:`read_snapshot`.
    """
    try:
        kind = os.lstat(target).st_mode
    except OSError:
        kind = 0
    if (stat.S_ISREG(kind) or stat.S_ISLNK(kind)) and renameat2.exchange(tmp, target):
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # now the old snapshot
        return
    os.replace(tmp, target)


def read_snapshot(path: str | os.PathLike[str]) -> SnapshotMetadata:
    """Validate a snapshot file completely on the host and return its metadata.

    Checks every rule, the end-of-archive marker and the payload checksum;
    no sandbox is involved.

    Raises:
        SnapshotError: the file breaks a rule, is corrupt or truncated.
    """
    with _open_snapshot(path) as snap:
        doc, whole, _ = _read_snapshot_file(snap, TarRules(max_bytes=MAX_FILE_SIZE), None)
    return _metadata(doc, Path(os.fspath(path)), snap.size, whole, snap.compressed)


def restore(sandbox: SandboxCore, path: str | os.PathLike[str]) -> SnapshotMetadata:
    """Replace the workspace with a snapshot's.  See :meth:`Sandbox.restore`."""
    sandbox.link()
    _require(sandbox, Capability.SNAPSHOT, "restoring snapshots")
    guard = sandbox.guard
    guard.approve("restore", {"path": os.fspath(path)})
    max_bytes = sandbox.config.limits.workspace
    with _too_big_for(sandbox):
        meta = _restore(sandbox, path, max_bytes)
    guard.emit(
        EventType.SNAPSHOT_RESTORED,
        {"path": str(meta.path), "sha256": meta.sha256, "files": meta.files, "size": meta.size},
    )
    return meta


@contextlib.contextmanager
def _too_big_for(sandbox: SandboxCore) -> Iterator[None]:
    """A snapshot that does not fit the workspace: say so, and how to make room."""
    try:
        yield
    except SnapshotError as exc:
        if exc.rule not in ("size", "no_space"):
            raise
        limits = sandbox.config.limits
        knob = "disk=" if limits.workspace_medium == "disk" else "workspace_size="
        raise SnapshotError(
            f"{exc} - the snapshot does not fit this sandbox's {format_size(limits.workspace)} workspace "
            f"(a restore stages the new files beside the old ones); restore it into a sandbox with a larger "
            f"{knob}, e.g. Sandbox.from_snapshot(path, {knob}...)",
            member=exc.member,
            rule=exc.rule,
        ) from None


def _restore(sandbox: SandboxCore, path: str | os.PathLike[str], max_bytes: int) -> SnapshotMetadata:
    # Fast path: the extractor runs on the host, in the workspace, with the
    # sandbox frozen throughout (nothing in it can race the extraction).
    with _open_snapshot(path) as snap, _frozen_live(sandbox) as local:
        if local is not None and snap.fd is not None:
            doc, whole = _restore_direct(sandbox, snap, max_bytes, local)
            return _metadata(doc, Path(os.fspath(path)), snap.size, whole, snap.compressed)
        _, feeder = _start_extractor(sandbox, max_bytes, local)
        try:
            # The extractor stages everything; it swaps only on commit, which
            # it gets only if the whole file checked out.
            doc, whole, _ = _read_snapshot_file(snap, TarRules(max_bytes=max_bytes), feeder.send)
            feeder.send(bytes(2 * tarfile.BLOCKSIZE))  # the end marker the host kept back
        except BaseException as exc:
            feeder.drop(exc)
            raise
        feeder.finish(commit=True)
    return _metadata(doc, Path(os.fspath(path)), snap.size, whole, snap.compressed)


def _restore_direct(
    sandbox: SandboxCore, snap: _SnapshotFile, max_bytes: int, local: Path
) -> tuple[dict[str, Any], str]:
    """A plain snapshot file restored on the host: extracted and checked at the same time.

    The extractor reads the file itself (its members' data copied by the
    kernel) while this process checks the whole file (every rule, the
    checksum, the metadata) on the other core; the extractor swaps the new
    files in only when this check has passed.
    """
    assert snap.fd is not None
    _, feeder = _start_extractor(sandbox, max_bytes, local, file_fd=snap.fd)
    try:
        doc, whole, _ = _read_snapshot_file(snap, TarRules(max_bytes=max_bytes), None)
    except BaseException as exc:
        feeder.drop(exc)
        raise
    feeder.finish(commit=True)
    return doc, whole
