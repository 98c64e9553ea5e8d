"""Reading archives: the stream gate's reader, tar parsing, snapshot files (the plumbing).

Everything the host reads (a tar writer's output, a snapshot file) passes
:class:`_Gate`, whose valve hands on only bytes of members that
:class:`TarRules` accepted.  The checks themselves (the valve, the order of
members, the end of the archive, the metadata member and the checksum) are
pure and live in :mod:`.rules`; this module reads, parses, hashes and writes.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import queue
import stat
import struct
import tarfile
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

from ..config import SnapshotMetadata
from ..errors import AgentNestError, SnapshotError
from .rules import (
    MAX_TRAILER_BYTES,
    METADATA_NAME,
    MiB,
    TarRules,
    _Stream,
    _stream_error,
    _Valve,
)

_READ_CHUNK = MiB
#: Chunks (of up to 1 MiB) waiting for a threaded _Digest: bounds the memory it holds.
_HASH_QUEUE = 16
_RECORD = tarfile.RECORDSIZE


# -- the stream gate ---------------------------------------------------------------------


class _Gate:
    """The file object :mod:`tarfile` reads: it passes on only validated bytes.

    It reads the source in chunks and hands every byte it consumes to its
    :class:`~agentnest.state.rules._Valve`, which alone reaches ``sink`` and
    decides what passes: bytes of members the rules accepted (``valve.allow``),
    held headers up to :data:`~agentnest.state.rules.HOLD_LIMIT`, the trailer
    to ``dropped`` only.

    It only seeks forward: tarfile's random-access mode (``r:``) skips a
    member's data with ``seek``, and the gate hands those bytes to the sink
    as views of the chunks it received, without copying them.
    """

    def __init__(
        self,
        source: Callable[[], bytes],
        sink: Callable[[memoryview], object] | None,
        dropped: Callable[[memoryview], object] | None = None,
    ) -> None:
        self._source = source
        self.valve = _Valve(sink, dropped)
        self._chunk = b""
        self._off = 0
        self.eof = False

    @property
    def position(self) -> int:
        """Bytes consumed from the source."""
        return self.valve.position

    def _take(self, n: int) -> memoryview | None:
        """Consume up to ``n`` bytes (one chunk at most); ``None`` at the end."""
        if self._off >= len(self._chunk):
            if self.eof:
                return None
            chunk = self._source()
            if not chunk:
                self.eof = True
                return None
            self._chunk, self._off = chunk, 0
        end = min(len(self._chunk), self._off + n)
        view = memoryview(self._chunk)[self._off : end]
        self._off = end
        self.valve.feed(view)
        return view

    def read(self, size: int = -1) -> bytes:
        """Exactly ``size`` bytes, fewer only at the end of the stream."""
        if size < 0:
            size = 1 << 62
        parts: list[memoryview] = []
        while size > 0:
            view = self._take(size)
            if view is None:
                break
            parts.append(view)
            size -= len(view)
        return parts[0].tobytes() if len(parts) == 1 else b"".join(parts)

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence != 0 or offset < self.position:
            raise io.UnsupportedOperation("the archive stream only seeks forward")
        while self.position < offset and self._take(offset - self.position) is not None:
            pass
        return self.position

    def tell(self) -> int:
        return self.position

    def rest(self, limit: int) -> bytes:
        """Everything not yet released (held, unread), up to ``limit`` + 1 bytes."""

        def unread(held: bytearray) -> bytes:
            out = bytearray(held)
            out += memoryview(self._chunk)[self._off :]
            self._chunk, self._off = b"", 0
            while len(out) <= limit and not self.eof:
                chunk = self._source()
                if not chunk:
                    self.eof = True
                out += chunk
            return bytes(out[: limit + 1])

        return self.valve.trailer(unread)


def _read_archive(
    gate: _Gate,
    rules: TarRules,
    *,
    snapshot_file: bool,
    on_member: Callable[[tarfile.TarFile, tarfile.TarInfo, list[str], str], None] | None = None,
    on_metadata: Callable[[], None] | None = None,
) -> _Stream:
    """Parse a tar stream through ``gate``; :meth:`_Stream.admit` checks each member.

    ``snapshot_file`` streams (snapshot files) end with an end-of-archive
    marker, and their metadata member, if any, must be last (``on_metadata``
    runs when it starts: everything before it is the payload); other streams
    (from a tar writer in a sandbox) end right after their last member.
    """
    result = _Stream(rules, gate.valve, snapshot_file=snapshot_file, on_metadata=on_metadata)
    with _open_tar(gate) as tar:
        while True:
            try:
                member = tar.next()
            except AgentNestError:
                raise
            except (tarfile.TarError, EOFError, ValueError, OSError, zlib.error, struct.error) as exc:
                raise _stream_error(exc, after=result.last) from None
            if member is None:
                break
            cast(Any, tar).members = []  # stream mode would keep every member otherwise
            checked = result.admit(tar, member)
            if checked is not None and on_member is not None:
                on_member(tar, member, *checked)
        result.end(gate.rest(MAX_TRAILER_BYTES if snapshot_file else 0))
        if not snapshot_file or result.metadata is None:
            result.payload = gate.position  # a plain tar or a writer's stream: all of it is payload
    return result


@contextlib.contextmanager
def _open_tar(gate: _Gate) -> Iterator[tarfile.TarFile]:
    try:
        # "r:" (random access), not "r|": the gate seeks forward over data,
        # which costs no copies, where the stream mode would read it through.
        tar = tarfile.open(  # noqa: SIM115 - closed by the `with` below, once it opened
            fileobj=cast(IO[bytes], gate), mode="r:", encoding="utf-8", errors="surrogateescape"
        )
    except AgentNestError:
        raise
    except (tarfile.TarError, EOFError, ValueError, OSError, zlib.error, struct.error) as exc:
        raise _stream_error(exc) from None
    with tar:
        yield tar


def _verify(result: _Stream, digest: str) -> dict[str, Any]:
    """The metadata, checked against the payload (:meth:`_Stream.verify`); a tar without gets a stand-in."""
    result.verify(digest)
    if result.metadata is not None:
        return result.metadata
    rules = result.rules
    return {
        "image": "",
        "created": 0.0,
        "sha256": "",
        "size": rules.size,
        "files": rules.files,
        "entries": rules.entries,
        "sandbox_id": "",
        "skipped": [],
    }


def _metadata_member(doc: dict[str, Any], offset: int) -> bytes:
    """The metadata member and the end of the archive, padded like ``tar`` pads."""
    data = json.dumps(doc, indent=2, sort_keys=True).encode() + b"\n"
    info = tarfile.TarInfo(METADATA_NAME)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = int(doc["created"])
    out = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape") + data
    out += bytes(-len(out) % tarfile.BLOCKSIZE) + bytes(2 * tarfile.BLOCKSIZE)
    out += bytes(-(offset + len(out)) % _RECORD)
    return out


# -- snapshot files -----------------------------------------------------------------------


class _Digest:
    """SHA-256 of a stream; :meth:`mark` gives the digest so far while it goes on.

    With ``threaded``, the hashing runs in a helper thread, beside the
    caller's own work on the same bytes (hashlib releases the GIL for large
    buffers): with a core free, a snapshot's SHA-256 (~80 ms per 100 MiB
    here) overlaps with writing the file instead of adding to it.  The
    bytes handed to :meth:`update` must not change afterwards (``bytes``,
    or views of them).  At most :data:`_HASH_QUEUE` chunks wait.
    """

    def __init__(self, *, threaded: bool = False) -> None:
        self._hash = hashlib.sha256()
        self._queue: queue.Queue[bytes | memoryview | None] | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        if threaded:
            self._queue = queue.Queue(maxsize=_HASH_QUEUE)
            self._thread = threading.Thread(target=self._run, name="agentnest-sha256", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        assert self._queue is not None
        while True:
            data = self._queue.get()
            try:
                if data is None:
                    return
                if self._error is None:
                    self._hash.update(data)
            except BaseException as exc:  # handed to the caller at the next sync point
                self._error = exc
            finally:
                self._queue.task_done()

    def update(self, data: bytes | memoryview) -> None:
        if self._queue is None:
            self._hash.update(data)
        else:
            self._queue.put(data)

    def _sync(self) -> None:
        if self._queue is not None:
            self._queue.join()
            if self._error is not None:
                raise self._error

    def mark(self) -> str:
        self._sync()
        return self._hash.copy().hexdigest()

    def hexdigest(self) -> str:
        self._sync()
        return self._hash.hexdigest()

    def close(self) -> None:
        if self._queue is not None and self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._queue = None


class _HashingFile:
    """A binary file object that hashes what passes through it."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.hash = hashlib.sha256()

    def write(self, data: bytes | memoryview) -> int:
        self.hash.update(data)
        return self.raw.write(data)

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.hash.update(data)
        return data

    def flush(self) -> None:
        self.raw.flush()


def _metadata(doc: dict[str, Any], path: Path, size: int, sha256: str, compressed: bool) -> SnapshotMetadata:
    return SnapshotMetadata(
        path=path,
        size=size,
        sha256=sha256,
        created_at=float(doc["created"]),
        image=doc["image"],
        files=doc["files"],
        entries=doc["entries"],
        workspace_size=doc["size"],
        payload_sha256=doc["sha256"],
        sandbox_id=doc["sandbox_id"],
        compressed=compressed,
        skipped=tuple(doc["skipped"]),
    )


@dataclass
class _SnapshotFile:
    """A snapshot file opened for reading: decompressed chunks, and how to hash the file."""

    read_chunk: Callable[[], bytes]
    compressed: bool
    size: int
    raw_hash: _HashingFile | None
    """Hashes the compressed bytes; ``None`` for a plain tar, hashed through the gate."""
    fd: int | None = None
    """The open file of a plain (uncompressed) snapshot, for a reader of its own; ``None`` if compressed."""


@contextlib.contextmanager
def _open_snapshot(path: str | os.PathLike[str]) -> Iterator[_SnapshotFile]:
    name = os.fspath(path)
    try:
        # O_NONBLOCK: a FIFO planted at the path must not hang the open.
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise SnapshotError(f"cannot open the snapshot {name!r}: {exc.strerror}", rule="io") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SnapshotError(f"the snapshot {name!r} is not a regular file", rule="io")
        os.set_blocking(fd, True)
        raw = open(fd, "rb", buffering=0)  # noqa: SIM115 - closed below
    except BaseException:
        os.close(fd)
        raise
    with raw:
        compressed = os.pread(fd, 2, 0) == b"\x1f\x8b"
        hashing = _HashingFile(raw) if compressed else None
        reader: IO[bytes] = (
            cast(IO[bytes], gzip.GzipFile(fileobj=cast(IO[bytes], hashing), mode="rb")) if compressed else raw
        )

        def read_chunk() -> bytes:
            try:
                return reader.read(_READ_CHUNK)
            except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
                raise _stream_error(exc) from None
            except OSError as exc:
                raise SnapshotError(f"reading {name!r} failed: {exc}", rule="io") from None

        yield _SnapshotFile(read_chunk, compressed, st.st_size, hashing, None if compressed else fd)


def _read_snapshot_file(
    snap: _SnapshotFile, rules: TarRules, sink: Callable[[memoryview], object] | None
) -> tuple[dict[str, Any], str, str]:
    """Validate a snapshot file through ``sink``; return (metadata, file sha256, payload sha256)."""
    digest = _Digest()
    payload: list[str] = []

    def passed(data: memoryview) -> None:
        digest.update(data)
        if sink is not None:
            sink(data)

    try:
        # A plain tar's file hash is the payload's hash continued over the
        # dropped metadata member and the trailer: one pass over the bytes.
        gate = _Gate(snap.read_chunk, passed, None if snap.compressed else digest.update)
        result = _read_archive(
            gate, rules, snapshot_file=True, on_metadata=lambda: payload.append(digest.mark())
        )
        if snap.compressed:
            while snap.read_chunk():  # the gzip trailer: its CRC is checked at the end
                pass
        payload_hex = payload[0] if payload else digest.mark()
        doc = _verify(result, payload_hex)
    finally:
        whole = digest.hexdigest()
    if snap.raw_hash is not None:
        whole = snap.raw_hash.hash.hexdigest()
    return doc, whole, payload_hex
