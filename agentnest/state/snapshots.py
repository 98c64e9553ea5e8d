"""Snapshot, restore and snapshot files: see :meth:`Sandbox.snapshot` and :meth:`Sandbox.restore`."""

from __future__ import annotations

import contextlib
import gzip
import os
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from ..config import SnapshotMetadata, format_size
from ..errors import SnapshotError
from ..events import EventType
from ..runtime.base import Capability
from .archive import (
    _Digest,
    _Gate,
    _HashingFile,
    _metadata,
    _metadata_member,
    _open_snapshot,
    _read_snapshot_file,
)
from .programs import (
    _frozen_live,
    _frozen_workspace,
    _read_program,
    _require,
    _start_extractor,
    _start_writer,
    _writer_args,
)
from .rules import FORMAT_NAME, FORMAT_VERSION, MAX_FILE_SIZE, MiB, TarRules

if TYPE_CHECKING:
    from ..sandbox import Sandbox


def snapshot(sandbox: Sandbox, path: str | os.PathLike[str], *, compress: bool = False) -> SnapshotMetadata:
    """Write the workspace to ``path`` as a snapshot tar.  See :meth:`Sandbox.snapshot`."""
    sandbox._ch()  # raises SandboxDestroyedError first
    _require(sandbox, Capability.SNAPSHOT, "snapshots")
    target = Path(os.fspath(path))
    guard = sandbox._guard
    guard.approve("snapshot", {"path": str(target), "compress": bool(compress)})
    created = time.time()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)  # as 0.3.0 did
    except OSError as exc:
        raise SnapshotError(f"cannot create {str(target.parent)!r}: {exc.strerror}", rule="io") from None
    # Written beside the target and renamed over it: a reader never sees half a snapshot.
    tmp = target.with_name(f".{target.name}.agentnest-{os.getpid()}-{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    digest = _Digest()  # the payload, then (uncompressed) the rest of the file
    try:
        with open(fd, "wb", buffering=MiB) as raw:
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

            # Fast path: a read-only copy of the workspace made on the host while
            # the sandbox was frozen for an instant, read on the host.
            with _frozen_workspace(sandbox) as local:
                writer = _start_writer(sandbox, _writer_args(sandbox), local)
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
            size = os.fstat(fd).st_size
        whole = hashing.hash.hexdigest() if hashing is not None else digest.hexdigest()
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        digest.close()
    meta = _metadata(doc, target, size, whole, compress)
    guard.emit(
        EventType.SNAPSHOT_CREATED,
        {"path": str(target), "sha256": meta.sha256, "size": meta.size, "files": meta.files},
    )
    return meta


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


def restore(sandbox: Sandbox, path: str | os.PathLike[str]) -> SnapshotMetadata:
    """Replace the workspace with a snapshot's.  See :meth:`Sandbox.restore`."""
    sandbox._ch()
    _require(sandbox, Capability.SNAPSHOT, "restoring snapshots")
    guard = sandbox._guard
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
def _too_big_for(sandbox: Sandbox) -> Iterator[None]:
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


def _restore(sandbox: Sandbox, path: str | os.PathLike[str], max_bytes: int) -> SnapshotMetadata:
    # Fast path: the extractor runs on the host, in the workspace, with the
    # sandbox frozen throughout (nothing in it can race the extraction).
    with _open_snapshot(path) as snap, _frozen_live(sandbox) as local:
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


def from_snapshot(
    cls: type[Sandbox], path: str | os.PathLike[str], image: str | None, kwargs: dict[str, Any]
) -> Sandbox:
    """Create a sandbox and restore a snapshot into it.  See :meth:`Sandbox.from_snapshot`."""
    meta = read_snapshot(path)
    sandbox = cls(image if image is not None else (meta.image or None), **kwargs)
    try:
        sandbox.restore(path)
    except BaseException:
        sandbox.destroy()
        raise
    return sandbox
