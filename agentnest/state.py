"""Workspace state: snapshot, restore, fork, artifacts and download.

Everything here moves through the agent channel, so it works the same when
the engine is remote: small stdlib programs run inside the sandbox (a tar
writer, a safe extractor, a hasher) through an :class:`ExecHandle`, and the
host streams their bytes without holding a workspace in memory.

**Snapshot format** (docs/state.md has the long version): an uncompressed
(or gzip) POSIX tar whose members are the workspace below a ``workspace/``
prefix (``workspace/``, ``workspace/src/main.py``...), followed by one last
member, ``agentnest-snapshot.json``: format name and version, image, creation
time, sandbox id, counts, total size and the SHA-256 of the *payload* (every
tar byte before the metadata member).  Sparse files are GNU sparse 1.0
members: only their data is stored.

**Safe extraction is enforced twice**: the host validates every member of
the stream before passing its bytes on (:class:`TarRules`, :class:`_Gate`),
and the extractor inside the sandbox validates again with its own copy of the
rules.  Refused, each with a :class:`SnapshotError` naming the member and
the rule: absolute paths, ``..``, names that are not normalised or too long,
hardlinks (all of them), device nodes, FIFOs, other special types,
symlinks that are absolute or could resolve outside the workspace, members
below a file or a symlink, duplicates, more data than the workspace holds,
more entries than :data:`MAX_ENTRIES`, global PAX headers, malformed sparse
maps, and any corruption or truncation (the end-of-archive marker is
required, and so is the payload checksum when the metadata member is there:
a plain tar of the same layout, such as a 0.3.0 snapshot, is accepted
without one).  The extractor writes into a
staging directory inside the workspace and swaps it in only when the host
has checked the whole stream and says so, so a failed restore leaves the old
files untouched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import io
import json
import os
import re
import stat
import struct
import tarfile
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from .channel.client import ExecHandle
from .channel.protocol import RawExit
from .config import Artifact, SnapshotMetadata
from .errors import (
    AgentNestError,
    ChannelError,
    ConfigurationError,
    FileAccessError,
    SnapshotError,
    UnsupportedCapabilityError,
)
from .events import EventType
from .runtime.base import Capability

if TYPE_CHECKING:
    from .sandbox import Sandbox

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MAX_ENTRIES",
    "METADATA_NAME",
    "PAYLOAD_PREFIX",
    "TarRules",
    "glob_to_regex",
    "read_snapshot",
    "symlink_target_ok",
]

MiB = 1024 * 1024
#: Format name and version written into (and required from) the metadata member.
FORMAT_NAME = "agentnest-snapshot"
FORMAT_VERSION = 1
#: Every workspace member lives below this top-level directory in the tar.
PAYLOAD_PREFIX = "workspace"
#: The metadata member: always the last member of a snapshot.
METADATA_NAME = "agentnest-snapshot.json"
#: Most members (files, directories, links, implied parent directories) in one archive.
MAX_ENTRIES = 100_000
#: Longest member name and symlink target, in bytes; longest path component.
MAX_NAME_BYTES = 4096
MAX_COMPONENT_BYTES = 255
#: Largest apparent size of one file.  Holes of sparse files are not stored
#: and not counted against the data limit, so this bounds them on their own.
MAX_FILE_SIZE = 1 << 40
#: Most data segments in one sparse file's map.
MAX_SPARSE_SEGMENTS = 65536
#: Bytes the host holds beyond the last validated member (the next member's
#: headers, the rest of a chunk) before it refuses the stream: a huge
#: extended header cannot make the host buffer without bound.
HOLD_LIMIT = 4 * MiB
#: Largest metadata member, and most trailing zero bytes accepted after the archive.
MAX_METADATA_BYTES = 64 * 1024
MAX_TRAILER_BYTES = 1 * MiB
#: Flow control of streams into the extractor: bytes sent but not yet
#: acknowledged, and how often the extractor acknowledges.  Bounds what the
#: in-sandbox agent queues in memory (it reads its channel eagerly).  The
#: window must exceed the acknowledgement interval, or both ends would wait.
ACK_WINDOW = 8 * MiB
ACK_EVERY = 1 * MiB
#: One stdin frame to the extractor: a 4-byte length and this much data at
#: most, 256 KiB in all.  Measured: with 1 MiB frames a 100 MB restore took
#: twice as long, because the agent re-slices a frame's unwritten remainder
#: after every partial write into the command's pipe.
_PIECE = 256 * 1024 - 4
#: Most matching files ``artifacts`` reports.
MAX_ARTIFACTS = 100_000
#: Names at the top of the workspace that restores use for staging; never archived.
STAGING_PREFIX = ".agentnest-restore-"
TRASH_PREFIX = ".agentnest-old-"
_RESERVED = (STAGING_PREFIX, TRASH_PREFIX)
#: Marker of the programs' structured stderr lines.
_MARK = "agentnest-state: "
_ERR_MAX = 64 * 1024
_READ_CHUNK = MiB
_RECORD = tarfile.RECORDSIZE
_HEX64 = re.compile(r"[0-9a-f]{64}")


# -- validation (pure) -------------------------------------------------------------------


def _refuse(member: str | None, rule: str, message: str) -> SnapshotError:
    where = f"{member!r}: " if member is not None else ""
    return SnapshotError(f"{where}{message} (rule: {rule})", member=member, rule=rule)


def _nbytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape"))


def symlink_target_ok(link: list[str], target: str) -> bool:
    """Whether a symlink at ``link`` (its path components below the workspace root) stays inside.

    The rule is strict on purpose, so that it holds whatever other links
    exist: the target is relative; it may start with ``..`` components, at
    most as many as the link's directory is deep; after those it has no
    ``..`` at all.  The link's directory is a real directory (members below a
    link are refused), so climbing from it never passes through a link, and
    what follows only descends.  (A rule that normalised ``a/../..`` lexically
    would be fooled by a link named ``a`` that points elsewhere.)
    """
    if not target or "\x00" in target or target.startswith("/") or _nbytes(target) > MAX_NAME_BYTES:
        return False
    parts = target.split("/")
    up = 0
    while up < len(parts) and parts[up] == "..":
        up += 1
    return ".." not in parts[up:] and up <= len(link) - 1


@dataclass
class TarRules:
    """The extraction rules, checked one member at a time (pure; no I/O).

    Args:
        max_bytes: most bytes of file data (holes of sparse files excluded).
        max_entries: most members, implied parent directories included.
        prefix: the top-level directory every member must be below.
        symlinks: allow symlinks (that stay inside); ``False`` refuses all.
        root_file: the prefix itself may be a regular file (a one-file download).
    """

    max_bytes: int
    max_entries: int = MAX_ENTRIES
    prefix: str = PAYLOAD_PREFIX
    symlinks: bool = True
    root_file: bool = False
    entries: int = 0
    files: int = 0
    size: int = 0
    """Apparent size of the regular files (holes included)."""
    stored: int = 0
    """Bytes of file data in the archive."""
    _kinds: dict[str, str] = field(default_factory=dict)

    def check(self, member: tarfile.TarInfo, span: int) -> tuple[list[str], str]:
        """Validate ``member``; return its path below the prefix and its kind.

        Args:
            member: the member as :mod:`tarfile` parsed it.
            span: bytes of data the member occupies in the stream (from its
                data offset to the next header), to catch a header whose
                sizes and sparse map disagree with the bytes that follow.

        Raises:
            SnapshotError: the member breaks a rule; ``.member`` and ``.rule`` say which.
        """
        name = member.name
        self._count(name)
        if not isinstance(name, str) or not name or "\x00" in name:
            raise _refuse(name, "name", "the member name is empty or contains a NUL byte")
        try:
            size_of_name = _nbytes(name)
        except UnicodeError:
            raise _refuse(name, "name", "the member name cannot be encoded") from None
        if size_of_name > MAX_NAME_BYTES:
            raise _refuse(name[:200], "name_length", f"the member name is longer than {MAX_NAME_BYTES} bytes")
        if member.isdir():
            name = name.rstrip("/") or name
        if name.startswith("/"):
            raise _refuse(name, "absolute", "absolute paths are refused")
        parts = name.split("/")
        if ".." in parts:
            raise _refuse(name, "dotdot", "'..' components are refused")
        if "" in parts or "." in parts:
            raise _refuse(name, "name", "the member name is not a normalised path ('//' or '.')")
        if any(_nbytes(p) > MAX_COMPONENT_BYTES for p in parts):
            raise _refuse(name, "name_length", f"a path component is longer than {MAX_COMPONENT_BYTES} bytes")
        if parts[0] != self.prefix:
            raise _refuse(name, "prefix", f"every member must be below {self.prefix + '/'!r}")
        rel = parts[1:]
        if rel and rel[0].startswith(_RESERVED):
            raise _refuse(name, "reserved", "names starting with '.agentnest-' are reserved at the top")
        kind = self._kind(member, name, rel)
        key = "/".join(rel)
        if not rel and kind != "dir" and not (kind == "file" and self.root_file):
            raise _refuse(name, "root", f"{self.prefix!r} itself must be a directory")
        for i in range(1, len(rel)):
            parent = "/".join(rel[:i])
            seen = self._kinds.get(parent)
            if seen is None:
                self._kinds[parent] = "implicit"
                self._count(name)  # an implied directory is an entry too
            elif seen not in ("dir", "implicit"):
                raise _refuse(name, "parent", f"{parent!r} is a {seen}; nothing can be below it")
        seen = self._kinds.get(key)
        if seen is not None and not (seen == "implicit" and kind == "dir"):
            raise _refuse(name, "duplicate", "the archive has this member twice")
        self._kinds[key] = kind
        if kind == "file":
            self._file(member, name, span)
        return rel, kind

    def _count(self, name: str) -> None:
        self.entries += 1
        if self.entries > self.max_entries:
            raise _refuse(name[:200], "entries", f"the archive has more than {self.max_entries} entries")

    def _kind(self, member: tarfile.TarInfo, name: str, rel: list[str]) -> str:
        if member.islnk():
            raise _refuse(
                name, "hardlink", "hardlinks are refused (a link could reach outside the workspace)"
            )
        if member.ischr() or member.isblk():
            raise _refuse(name, "device", "device nodes are refused")
        if member.isfifo():
            raise _refuse(name, "fifo", "FIFOs are refused")
        if member.isdir():
            return "dir"
        if member.issym():
            if not self.symlinks:
                raise _refuse(name, "link", "links are not copied here")
            if not symlink_target_ok(rel, member.linkname):
                raise _refuse(
                    name,
                    "symlink",
                    f"the symlink target {member.linkname[:200]!r} is absolute or may point outside the "
                    "workspace (allowed: relative, leading '..' no deeper than the link, no '..' after)",
                )
            return "symlink"
        if member.isreg():
            return "file"
        raise _refuse(name, "type", f"member type {member.type!r} is not supported")

    def _file(self, member: tarfile.TarInfo, name: str, span: int) -> None:
        size = member.size
        if not isinstance(size, int) or size < 0 or size > MAX_FILE_SIZE:
            raise _refuse(name, "file_size", f"the file's size is negative or over {MAX_FILE_SIZE} bytes")
        sparse = cast("list[tuple[int, int]] | None", member.sparse)
        if sparse is None:
            stored = size
        else:
            if len(sparse) > MAX_SPARSE_SEGMENTS:
                raise _refuse(name, "sparse", f"the sparse map has more than {MAX_SPARSE_SEGMENTS} segments")
            end = stored = 0
            for offset, length in sparse:
                if offset < end or length < 0 or offset + length > size:
                    raise _refuse(name, "sparse", "the sparse map is unsorted, overlapping or out of range")
                end = offset + length
                stored += length
        if not 0 <= span - stored < tarfile.BLOCKSIZE:
            raise _refuse(name, "corrupt", "the member's data does not match its header")
        self.files += 1
        self.size += size
        self.stored += stored
        if self.stored > self.max_bytes:
            raise _refuse(
                name, "size", f"the archive holds more than {self.max_bytes} bytes of file data (the limit)"
            )


def glob_to_regex(pattern: str) -> tuple[str, str]:
    """Translate a workspace glob into ``(literal base directory, regex)``.

    ``*`` and ``?`` match within one path component, ``[...]`` is a class
    (``[!...]`` negated), ``**`` matches any number of components (zero
    included).  Dotfiles match like any other name.  The regex is meant for
    ``re.fullmatch`` on workspace-relative paths.

    Raises:
        ConfigurationError: the pattern is empty, too long or climbs out with ``..``.
    """
    if not isinstance(pattern, str) or not pattern or "\x00" in pattern or len(pattern) > MAX_NAME_BYTES:
        raise ConfigurationError("the pattern must be a non-empty string of at most 4096 characters")
    parts = [p for p in pattern.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ConfigurationError(f"the pattern {pattern!r} climbs out of the workspace with '..'")
    if not parts:
        parts = ["**"]
    base: list[str] = []
    for part in parts[:-1]:
        if any(c in part for c in "*?["):
            break
        base.append(part)
    regex = ""
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            regex += ".*" if last else "(?:[^/]+/)*"
        else:
            regex += _glob_component(part) + ("" if last else "/")
    return "/".join(base), regex


def _glob_component(part: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(part):
        c = part[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = part.find("]", i + 2)
            if j < 0:
                out.append(re.escape(c))
            else:
                body = part[i + 1 : j]
                negate = body.startswith("!")
                if negate:
                    body = body[1:]
                # Escape everything but ranges: no nested sets or set operations.
                inner = "".join(ch if ch == "-" else re.escape(ch) for ch in body)
                out.append(f"[^/{inner}]" if negate else f"[{inner}]")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


# -- the stream gate ---------------------------------------------------------------------


class _Gate:
    """The file object :mod:`tarfile` reads: it passes on only validated bytes.

    Bytes the parser has read beyond the last validated member (the next
    member's headers) are held back until that member is validated too, at
    most :data:`HOLD_LIMIT` of them.  ``allow(offset)`` releases everything
    below ``offset``; with ``drop=True`` it is discarded instead of passed on
    (the metadata member of a snapshot).

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
        self._sink = sink
        self._dropped = dropped
        self._chunk = b""
        self._off = 0
        self._held = bytearray()
        self.position = 0
        """Bytes consumed from the source."""
        self._base = 0
        self._limit = 0
        self._drop = False
        self.eof = False

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
        self.position += len(view)
        if not self._held and self.position <= self._limit:
            self._base = self.position
            self._pass(view)
        else:
            self._held += view
            self._release()
            if len(self._held) > HOLD_LIMIT:
                raise _refuse(
                    None, "header", f"more than {HOLD_LIMIT} bytes of headers before a member (refused)"
                )
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

    def allow(self, limit: int, *, drop: bool = False) -> None:
        self._limit = limit
        self._drop = drop
        self._release()

    def _release(self) -> None:
        n = min(self._limit - self._base, len(self._held))
        if n > 0:
            data = bytes(self._held[:n])
            del self._held[:n]
            self._base += n
            self._pass(memoryview(data))

    def _pass(self, data: memoryview) -> None:
        if not self._drop:
            if self._sink is not None:
                self._sink(data)
        elif self._dropped is not None:
            self._dropped(data)

    def rest(self, limit: int) -> bytes:
        """Everything not yet released (held, unread), up to ``limit`` + 1 bytes."""
        out = bytearray(self._held)
        out += memoryview(self._chunk)[self._off :]
        self._held.clear()
        self._chunk, self._off = b"", 0
        while len(out) <= limit and not self.eof:
            chunk = self._source()
            if not chunk:
                self.eof = True
            out += chunk
        data = bytes(out[: limit + 1])
        if self._dropped is not None:
            self._dropped(memoryview(data))
        return data


@dataclass
class _Stream:
    """What came through one archive stream."""

    rules: TarRules
    metadata: dict[str, Any] | None = None
    payload: int = 0
    """Bytes of the payload (everything before the metadata member)."""


def _read_archive(
    gate: _Gate,
    rules: TarRules,
    *,
    snapshot_file: bool,
    on_member: Callable[[tarfile.TarFile, tarfile.TarInfo, list[str], str], None] | None = None,
    on_metadata: Callable[[], None] | None = None,
) -> _Stream:
    """Parse and validate a tar stream through ``gate``.

    ``snapshot_file`` streams (snapshot files) end with an end-of-archive
    marker, and their metadata member, if any, must be last (``on_metadata``
    runs when it starts: everything before it is the payload); other streams
    (from a tar writer in a sandbox) end right after their last member.
    """
    result = _Stream(rules)
    with _open_tar(gate) as tar:
        last: str | None = None
        while True:
            try:
                member = tar.next()
            except AgentNestError:
                raise
            except (tarfile.TarError, EOFError, ValueError, OSError, zlib.error, struct.error) as exc:
                raise _stream_error(exc, after=last) from None
            if member is None:
                break
            cast(Any, tar).members = []  # stream mode would keep every member otherwise
            if tar.pax_headers:
                raise _refuse(member.name, "global_header", "global PAX headers are refused")
            if result.metadata is not None:
                raise _refuse(
                    member.name, "metadata", f"a member follows {METADATA_NAME!r}, which must be last"
                )
            span = tar.offset - member.offset_data
            if snapshot_file and member.name == METADATA_NAME:
                result.payload = member.offset
                if on_metadata is not None:
                    on_metadata()
                gate.allow(tar.offset, drop=True)
                result.metadata = _read_metadata(tar, member)
                continue
            rel, kind = rules.check(member, span)
            last = member.name
            gate.allow(tar.offset)
            if on_member is not None:
                on_member(tar, member, rel, kind)
        if snapshot_file:
            _check_end(gate, result, last)
            if result.metadata is None:
                result.payload = gate.position  # a plain tar: all of it is payload
        else:
            extra = gate.rest(0)
            if extra:
                raise _refuse(
                    None, "corrupt", f"the stream has bytes after member {last!r} that are not a member"
                )
            result.payload = gate.position
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


def _read_program(program: _Program, gate: _Gate, rules: TarRules, **kw: Any) -> _Stream:
    """``_read_archive`` over a program's output; a program that failed explains itself."""
    try:
        return _read_archive(gate, rules, snapshot_file=False, **kw)
    except SnapshotError:
        if program.exit is not None and program.exit.code != 0:
            raise program.failure("the tar writer") from None
        raise


def _stream_error(exc: BaseException, after: str | None = None) -> SnapshotError:
    text = str(exc) or type(exc).__name__
    where = f" in or after member {after!r}" if after else ""
    if isinstance(exc, EOFError) or "unexpected end of data" in text or "truncated" in text.lower():
        return _refuse(None, "truncated", f"the archive is truncated{where} ({text[:300]})")
    return _refuse(None, "corrupt", f"the archive is corrupt{where} ({text[:300]})")


def _check_end(gate: _Gate, result: _Stream, last: str | None) -> None:
    trailer = gate.rest(MAX_TRAILER_BYTES)
    if trailer.count(0) != len(trailer):
        if len(trailer) < tarfile.BLOCKSIZE:
            raise _refuse(None, "truncated", f"the archive is truncated after member {last!r}")
        raise _refuse(None, "corrupt", f"the data after member {last!r} is not a valid tar header")
    if len(trailer) > MAX_TRAILER_BYTES:
        raise _refuse(None, "corrupt", f"more than {MAX_TRAILER_BYTES} bytes follow the end of the archive")
    # A tar without the metadata member (a 0.3.0 snapshot, or `tar -cf x.tar
    # workspace`) is accepted: every member is still checked, and a complete
    # end-of-archive marker proves it is not truncated; only the checksum is missing.
    if len(trailer) < 2 * tarfile.BLOCKSIZE:
        raise _refuse(None, "truncated", "the archive is truncated: its end-of-archive marker is missing")


def _read_metadata(tar: tarfile.TarFile, member: tarfile.TarInfo) -> dict[str, Any]:
    if not member.isreg() or member.sparse is not None or member.size > MAX_METADATA_BYTES:
        raise _refuse(
            METADATA_NAME, "metadata", f"must be a regular file of at most {MAX_METADATA_BYTES} bytes"
        )
    fileobj = tar.extractfile(member)
    if fileobj is None:  # pragma: no cover - a regular member always has a file object
        raise _refuse(METADATA_NAME, "metadata", "cannot read the metadata member")
    try:
        data = fileobj.read()
    except (tarfile.TarError, OSError) as exc:
        raise _stream_error(exc, after=METADATA_NAME) from None
    if len(data) != member.size:
        raise _refuse(METADATA_NAME, "truncated", "the metadata member is truncated")
    try:
        doc = json.loads(data)
    except ValueError:
        raise _refuse(METADATA_NAME, "metadata", "the metadata member is not JSON") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
        raise _refuse(METADATA_NAME, "metadata", f"not {FORMAT_NAME!r} metadata")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise _refuse(METADATA_NAME, "metadata", "the metadata has no format version")
    if version > FORMAT_VERSION:
        raise _refuse(
            METADATA_NAME,
            "version",
            f"snapshot format {version} is newer than this AgentNest reads ({FORMAT_VERSION}); "
            "upgrade agentnest",
        )
    checks: dict[str, Callable[[Any], bool]] = {
        "image": lambda v: isinstance(v, str) and 0 < len(v) <= 512 and not any(c.isspace() for c in v),
        "created": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0,
        "sha256": lambda v: isinstance(v, str) and bool(_HEX64.fullmatch(v)),
        "size": _is_count,
        "files": _is_count,
        "entries": _is_count,
        "sandbox_id": lambda v: isinstance(v, str) and len(v) <= 128,
        "skipped": lambda v: isinstance(v, list) and len(v) <= 1000 and all(isinstance(s, str) for s in v),
    }
    for key, ok in checks.items():
        if not ok(doc.get(key)):
            raise _refuse(METADATA_NAME, "metadata", f"the metadata field {key!r} is missing or invalid")
    return doc


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _verify(result: _Stream, digest: str) -> dict[str, Any]:
    """Check the metadata against the payload; a tar without metadata gets a stand-in."""
    meta = result.metadata
    rules = result.rules
    if meta is None:
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
    if meta["sha256"] != digest:
        raise _refuse(
            None, "checksum", "the payload's SHA-256 does not match the metadata: the file was altered"
        )
    counted = {"files": rules.files, "entries": rules.entries, "size": rules.size}
    for key, value in counted.items():
        if meta[key] != value:
            raise _refuse(None, "checksum", f"the metadata says {key}={meta[key]}, the archive has {value}")
    return meta


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


# -- programs that run inside the sandbox ----------------------------------------------
#
# Stdlib only, Python >= 3.8 syntax, started as `python3 -I -S -c CODE ARGS`:
# -I keeps the workspace off sys.path (a planted `tarfile.py` is not imported)
# and ignores PYTHON* variables; -S skips site-packages.  They never follow a
# symlink: every directory is opened with O_NOFOLLOW from its parent's fd.
# Structured errors go to stderr as one line "agentnest-state: {json}".

_COMMON = r"""
import errno, json, os, stat, sys
sys.setrecursionlimit(10000)
A = json.loads(sys.argv[1])
CH = 1 << 20
DIRF = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
RESERVED = (".agentnest-restore-", ".agentnest-old-")


class Refused(Exception):
    def __init__(self, rule, member, message):
        Exception.__init__(self, message)
        self.rule, self.member, self.message = rule, member, message


def report(rule, member, message, code=3):
    note = {"rule": rule, "member": member, "message": message}
    sys.stderr.write("agentnest-state: " + json.dumps(note) + "\n")
    sys.stderr.flush()
    os._exit(code)


def opendir(name, dfd=None):
    # No O_DIRECTORY: gVisor (2022) follows a final symlink when it is combined
    # with O_NOFOLLOW.  Open, then check.
    fd = os.open(name, DIRF, dir_fd=dfd)
    if not stat.S_ISDIR(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.ENOTDIR, "not a directory (or a symlink)", name)
    return fd


def oserror(exc):
    code = {errno.ENOENT: "not_found", errno.ENOSPC: "no_space", errno.EDQUOT: "no_space",
            errno.ENOTDIR: "not_directory", errno.ELOOP: "symlink", errno.EACCES: "permission",
            errno.EPERM: "permission"}.get(exc.errno, "io")
    return code, "%s: %s" % (exc.filename or "", exc.strerror or exc)
"""

#: Writes the tree at A["sub"] (below A["root"]) to stdout as tar members
#: named below A["prefix"], without the end-of-archive marker (the host adds
#: it).  Sparse files become GNU sparse 1.0 members holding only their data.
_WRITER = (
    _COMMON
    + r"""
import tarfile
BLK = 65536
ZERO = bytes(CH)
ZB = bytes(BLK)
SEEK = [None]
SENDFILE = [True]
totals = {"bytes": 0, "entries": 0}
skipped = []


def out(data):
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


def pad(n):
    if n % 512:
        out(bytes(512 - n % 512))


def count(arc, nbytes):
    totals["entries"] += 1
    totals["bytes"] += nbytes
    if totals["entries"] > A["max_entries"]:
        raise Refused("entries", arc, "the workspace has more than %d entries" % A["max_entries"])
    if totals["bytes"] > A["max_bytes"]:
        raise Refused("size", arc, "the workspace holds more than %d bytes" % A["max_bytes"])


def header(info, pax=None):
    if pax:
        info.pax_headers = pax
    out(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))


def seek_map(fd, size):
    segs, off = [], 0
    while off < size:
        try:
            data = os.lseek(fd, off, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                break
            raise
        if data >= size:
            break
        hole = min(os.lseek(fd, data, os.SEEK_HOLE), size)
        segs.append((data, hole - data))
        off = hole
    return segs


def zero_map(fd, size):
    # Without SEEK_HOLE (gVisor reports every block allocated) find the holes
    # by reading: reading a hole costs no copy from storage, only zero pages.
    segs, start, off = [], None, 0
    while off < size:
        buf = os.pread(fd, min(CH, size - off), off)
        if not buf:
            break
        n = len(buf)
        if buf == ZERO[:n]:
            if start is not None:
                segs.append((start, off - start))
                start = None
        else:
            view = memoryview(buf)
            for i in range(0, n, BLK):
                blk = view[i:i + BLK]
                if blk == ZB[:len(blk)]:
                    if start is not None:
                        segs.append((start, off + i - start))
                        start = None
                elif start is None:
                    start = off + i
        off += n
    if start is not None:
        segs.append((start, off - start))
    return segs


def data_map(fd, st):
    size = st.st_size
    if size < 2 * BLK:
        return None
    if SEEK[0] is None:
        try:
            os.lseek(fd, 0, os.SEEK_HOLE)
            SEEK[0] = True
        except (OSError, AttributeError):
            SEEK[0] = False
    if SEEK[0]:
        if st.st_blocks * 512 >= size:
            return None
        segs = seek_map(fd, size)
    else:
        segs = zero_map(fd, size)
    if segs == [(0, size)] or len(segs) > 4096:
        return None
    return segs


def copy(fd, off, n):
    end = off + n
    while off < end:
        k = 0
        if SENDFILE[0]:
            try:
                k = os.sendfile(1, fd, off, min(4 * CH, end - off))
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                SENDFILE[0] = False
                continue
        else:
            buf = os.pread(fd, min(CH, end - off), off)
            k = len(buf)
            out(buf)
        if not k:
            # The file shrank while we read it: keep the promised size.
            while off < end:
                z = min(CH, end - off)
                out(bytes(z))
                off += z
            return
        off += k


def emit_file(dfd, name, arc):
    fd = os.open(name, DIRF, dir_fd=dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            skipped.append(arc)
            return
        size = st.st_size
        segs = data_map(fd, st)
        info = tarfile.TarInfo(arc)
        info.mode = st.st_mode & 0o777
        info.mtime = int(st.st_mtime)
        if segs is None:
            count(arc, size)
            info.size = size
            header(info)
            copy(fd, 0, size)
            pad(size)
            return
        stored = sum(n for _, n in segs)
        count(arc, stored)
        entries = list(segs)
        if not entries or entries[-1][0] + entries[-1][1] < size:
            entries.append((size, 0))  # GNU tar marks a trailing hole this way
        smap = ("%d\n" % len(entries) + "".join("%d\n%d\n" % e for e in entries)).encode()
        smap += bytes(-len(smap) % 512)
        head, _, tail = arc.rpartition("/")
        fake = head + "/GNUSparseFile.0/" + tail
        info.name = fake
        info.size = len(smap) + stored
        # "path" first: tarfile applies PAX records in order, and
        # GNU.sparse.name must win over the placeholder name.
        header(info, {"path": fake, "GNU.sparse.major": "1", "GNU.sparse.minor": "0",
                      "GNU.sparse.name": arc, "GNU.sparse.realsize": str(size)})
        out(smap)
        for off, n in segs:
            copy(fd, off, n)
        pad(stored)
    finally:
        os.close(fd)


def visit(dfd, name, arc, top=False):
    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    if stat.S_ISDIR(st.st_mode):
        count(arc, 0)
        info = tarfile.TarInfo(arc)
        info.type = tarfile.DIRTYPE
        info.mode = st.st_mode & 0o777
        info.mtime = int(st.st_mtime)
        header(info)
        fd = opendir(name, dfd)
        try:
            walk(fd, arc, top)
        finally:
            os.close(fd)
    elif stat.S_ISREG(st.st_mode):
        emit_file(dfd, name, arc)
    elif stat.S_ISLNK(st.st_mode):
        count(arc, 0)
        info = tarfile.TarInfo(arc)
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(name, dir_fd=dfd)
        info.mtime = int(st.st_mtime)
        header(info)
    else:
        skipped.append(arc)


def walk(fd, arc, top=False):
    for name in sorted(os.listdir(fd)):
        if top and name.startswith(RESERVED):
            continue
        try:
            visit(fd, name, arc + "/" + name)
        except FileNotFoundError:
            pass  # removed while we walked


def main():
    root = opendir(A["root"])
    parts = [p for p in A["sub"].split("/") if p]
    if not parts:
        st = os.fstat(root)
        count(A["prefix"], 0)
        info = tarfile.TarInfo(A["prefix"])
        info.type = tarfile.DIRTYPE
        info.mode = st.st_mode & 0o777
        info.mtime = int(st.st_mtime)
        header(info)
        walk(root, A["prefix"], top=True)
        return
    dfd = root
    for p in parts[:-1]:
        dfd = opendir(p, dfd)
    visit(dfd, parts[-1], A["prefix"])


if A.get("wait") and sys.stdin.buffer.read(1) != b"g":
    report("aborted", None, "the host called the stream off", code=4)
try:
    main()
except Refused as exc:
    report(exc.rule, exc.member, exc.message)
except OSError as exc:
    rule, message = oserror(exc)
    report(rule, A["sub"] or None, message)
note = {"skipped": skipped[:1000], "nskipped": len(skipped)}
sys.stderr.write("agentnest-state: " + json.dumps(note) + "\n")
"""
)

#: Reads a tar stream from stdin (length-prefixed chunks, a zero length at
#: the end, then one decision byte: "C" commit, anything else abort),
#: validates every member with its own copy of the rules, writes it into a
#: staging directory and, on commit, swaps the staging directory's contents
#: in for the workspace's.  Prints "a N" acknowledgements (N raw bytes
#: consumed) and a final JSON line on stdout.
_EXTRACTOR = (
    _COMMON
    + r"""
import struct, tarfile
NEWF = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
PREFIX = A["prefix"]
# The pid in the names lets a later restore sweep what a killed one left.
STAGE = ".agentnest-restore-%d-%s" % (os.getpid(), A["token"])
TRASH = ".agentnest-old-%d-%s" % (os.getpid(), A["token"])


class Feed:
    # tarfile reads this in "r:" mode: read() returns exactly what it asks
    # for, seek() only goes forward, and file data is copied with piece()
    # straight from the frames (no re-buffering).
    def __init__(self):
        self.inp = sys.stdin.buffer
        self.left = 0
        self.done = False
        self.raw = 0
        self.acked = 0
        self.pos = 0

    def exact(self, n):
        data = self.inp.read(n)
        if len(data) != n:
            raise Refused("truncated", None, "the stream from the host ended early")
        self.raw += n
        if self.raw - self.acked >= A["ack"]:
            self.acked = self.raw
            os.write(1, b"a %d\n" % self.raw)
        return data

    def piece(self, n):
        if self.done or n <= 0:
            return b""
        if not self.left:
            (self.left,) = struct.unpack(">I", self.exact(4))
            if not self.left:
                self.done = True
                return b""
        data = self.exact(min(n, self.left))
        self.left -= len(data)
        self.pos += len(data)
        return data

    def read(self, n=-1):
        if n < 0:
            n = 1 << 62
        parts = []
        while n > 0:
            data = self.piece(n)
            if not data:
                break
            parts.append(data)
            n -= len(data)
        return b"".join(parts)

    def seek(self, pos, whence=0):
        if whence != 0 or pos < self.pos:
            raise OSError(errno.ESPIPE, "the stream only seeks forward")
        while self.pos < pos and self.piece(min(CH, pos - self.pos)):
            pass
        return self.pos

    def tell(self):
        return self.pos


def nbytes(s):
    return len(s.encode("utf-8", "surrogateescape"))


def link_ok(rel, target):
    if not target or "\x00" in target or target.startswith("/") or nbytes(target) > 4096:
        return False
    parts = target.split("/")
    up = 0
    while up < len(parts) and parts[up] == "..":
        up += 1
    return ".." not in parts[up:] and up <= len(rel) - 1


class Rules:
    def __init__(self):
        self.kinds = {}
        self.entries = self.files = self.stored = 0

    def more(self, name):
        self.entries += 1
        if self.entries > A["max_entries"]:
            raise Refused("entries", name, "more than %d entries" % A["max_entries"])

    def check(self, m, span):
        name = m.name
        self.more(name)
        if not name or "\x00" in name:
            raise Refused("name", name, "empty name or NUL byte")
        if nbytes(name) > 4096:
            raise Refused("name_length", name[:200], "name longer than 4096 bytes")
        if m.isdir():
            name = name.rstrip("/") or name
        if name.startswith("/"):
            raise Refused("absolute", name, "absolute paths are refused")
        parts = name.split("/")
        if ".." in parts:
            raise Refused("dotdot", name, "'..' components are refused")
        if "" in parts or "." in parts:
            raise Refused("name", name, "not a normalised path")
        if any(nbytes(p) > 255 for p in parts):
            raise Refused("name_length", name, "a component is longer than 255 bytes")
        if parts[0] != PREFIX:
            raise Refused("prefix", name, "every member must be below %r" % (PREFIX + "/"))
        rel = parts[1:]
        if rel and rel[0].startswith(RESERVED):
            raise Refused("reserved", name, "reserved name")
        if m.islnk():
            raise Refused("hardlink", name, "hardlinks are refused")
        if m.ischr() or m.isblk():
            raise Refused("device", name, "device nodes are refused")
        if m.isfifo():
            raise Refused("fifo", name, "FIFOs are refused")
        if m.isdir():
            kind = "dir"
        elif m.issym():
            if not link_ok(rel, m.linkname):
                raise Refused("symlink", name, "symlink target may point outside the workspace")
            kind = "symlink"
        elif m.isreg():
            kind = "file"
        else:
            raise Refused("type", name, "member type %r is not supported" % m.type)
        if not rel and kind != "dir":
            raise Refused("root", name, "the top member must be a directory")
        for i in range(1, len(rel)):
            p = "/".join(rel[:i])
            seen = self.kinds.get(p)
            if seen is None:
                self.kinds[p] = "implicit"
                self.more(name)
            elif seen not in ("dir", "implicit"):
                raise Refused("parent", name, "%r is a %s" % (p, seen))
        key = "/".join(rel)
        seen = self.kinds.get(key)
        if seen is not None and not (seen == "implicit" and kind == "dir"):
            raise Refused("duplicate", name, "duplicate member")
        self.kinds[key] = kind
        if kind == "file":
            if m.size < 0 or m.size > A["max_file"]:
                raise Refused("file_size", name, "file size out of range")
            stored = m.size
            if m.sparse is not None:
                end = stored = 0
                if len(m.sparse) > 65536:
                    raise Refused("sparse", name, "too many sparse segments")
                for off, n in m.sparse:
                    if off < end or n < 0 or off + n > m.size:
                        raise Refused("sparse", name, "bad sparse map")
                    end = off + n
                    stored += n
            if not 0 <= span - stored < 512:
                raise Refused("corrupt", name, "data does not match the header")
            self.files += 1
            self.stored += stored
            if self.stored > A["max_bytes"]:
                raise Refused("size", name, "more than %d bytes of file data" % A["max_bytes"])
        return rel, kind


class Tree:
    def __init__(self, sfd):
        self.sfd = sfd
        self.parts = ()
        self.fd = sfd
        self.dirs = []
        self.top = []

    def parent(self, rel):
        parts = tuple(rel[:-1])
        if parts == self.parts:
            return self.fd
        if self.fd != self.sfd:
            os.close(self.fd)
        self.parts, self.fd = (), self.sfd
        fd = self.sfd
        for p in parts:
            try:
                nfd = opendir(p, fd)
            except FileNotFoundError:
                os.mkdir(p, 0o755, dir_fd=fd)
                nfd = opendir(p, fd)
            if fd != self.sfd:
                os.close(fd)
            fd = nfd
        self.parts, self.fd = parts, fd
        return fd

    def add(self, tar, m, rel, kind):
        if not rel:
            return
        pfd = self.parent(rel)
        name = rel[-1]
        if kind == "dir":
            try:
                os.mkdir(name, 0o700, dir_fd=pfd)
            except FileExistsError:
                os.close(opendir(name, pfd))  # an implied directory: must be a real one
            self.dirs.append((rel, m.mode & 0o777, m.mtime))
        elif kind == "symlink":
            os.symlink(m.linkname, name, dir_fd=pfd)
        else:
            fd = os.open(name, NEWF, 0o600, dir_fd=pfd)
            try:
                src = tar.fileobj
                if src.tell() != m.offset_data:
                    raise Refused("corrupt", m.name, "stream out of step")
                if m.sparse is None:
                    self.copy(src, fd, m.size, m.name)
                else:
                    for off, n in m.sparse:
                        os.lseek(fd, off, os.SEEK_SET)
                        self.copy(src, fd, n, m.name)
                    os.ftruncate(fd, m.size)
                os.fchmod(fd, m.mode & 0o777)
                os.utime(fd, (m.mtime, m.mtime))
            finally:
                os.close(fd)

    def copy(self, src, fd, n, member):
        while n:
            data = src.piece(min(CH, n))
            if not data:
                raise Refused("truncated", member, "the member's data is truncated")
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            n -= len(data)

    def finish(self):
        # Directory modes last (a read-only directory must not stop its own
        # extraction), deepest first.  Top-level ones stay writable until the
        # swap: moving a directory to another parent needs write access to it.
        if self.fd != self.sfd:
            os.close(self.fd)
        self.parts, self.fd = (), self.sfd
        for rel, mode, mtime in sorted(self.dirs, key=lambda d: -len(d[0])):
            fd = self.sfd
            opened = []
            try:
                for p in rel:
                    fd = opendir(p, fd)
                    opened.append(fd)
                if len(rel) == 1:
                    self.top.append((rel[0], mode, mtime))
                    mode |= 0o700
                os.fchmod(fd, mode)
                os.utime(fd, (mtime, mtime))
            finally:
                for o in opened:
                    os.close(o)

    def settle(self, rootfd):
        for name, mode, mtime in self.top:
            fd = opendir(name, rootfd)
            try:
                os.fchmod(fd, mode)
                os.utime(fd, (mtime, mtime))
            finally:
                os.close(fd)


def rmtree(name, dfd):
    try:
        fd = opendir(name, dfd)
    except (FileNotFoundError, NotADirectoryError):
        return
    try:
        os.fchmod(fd, 0o700)
        for entry in os.listdir(fd):
            try:
                st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                rmtree(entry, fd)
            else:
                os.unlink(entry, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dfd)


def sweep(rootfd):
    # Staging left by a restore whose extractor was killed: its pid is gone.
    for name in os.listdir(rootfd):
        if name.startswith(RESERVED) and name not in (STAGE, TRASH):
            try:
                pid = int(name.split("-")[2])
                if pid <= 0:
                    continue
                os.kill(pid, 0)
                continue
            except (ValueError, IndexError):
                continue
            except ProcessLookupError:
                pass
            except OSError:
                continue
            rmtree(name, rootfd)


def writable(name, rootfd, undo):
    # An old top-level directory without owner write access cannot be moved
    # away: grant it for the move (undone if the swap is rolled back).
    fd = opendir(name, rootfd)
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if not mode & 0o200:
            os.fchmod(fd, mode | 0o700)
            undo.append((name, mode))
    finally:
        os.close(fd)


def swap(rootfd, sfd):
    olds = [n for n in os.listdir(rootfd) if not n.startswith(RESERVED)]
    os.mkdir(TRASH, 0o700, dir_fd=rootfd)
    tfd = opendir(TRASH, rootfd)
    moved, placed, undo = [], [], []
    try:
        for n in olds:
            if stat.S_ISDIR(os.stat(n, dir_fd=rootfd, follow_symlinks=False).st_mode):
                writable(n, rootfd, undo)
            os.rename(n, n, src_dir_fd=rootfd, dst_dir_fd=tfd)
            moved.append(n)
        for n in os.listdir(sfd):
            os.rename(n, n, src_dir_fd=sfd, dst_dir_fd=rootfd)
            placed.append(n)
    except OSError:
        for n in placed:
            os.rename(n, n, src_dir_fd=rootfd, dst_dir_fd=sfd)
        for n in moved:
            os.rename(n, n, src_dir_fd=tfd, dst_dir_fd=rootfd)
        for n, mode in undo:
            fd = opendir(n, rootfd)
            os.fchmod(fd, mode)
            os.close(fd)
        os.close(tfd)
        rmtree(TRASH, rootfd)
        raise
    os.close(tfd)
    try:
        rmtree(TRASH, rootfd)
    except OSError:
        pass  # the new contents are in place; old files we cannot remove stay hidden


def main():
    try:
        # A bigger stdin pipe: the agent writes our input in fewer, whole pieces.
        import fcntl

        fcntl.fcntl(0, 1031, CH)  # F_SETPIPE_SZ
    except (ImportError, OSError):
        pass
    rootfd = opendir(A["root"])
    sweep(rootfd)
    os.mkdir(STAGE, 0o700, dir_fd=rootfd)
    sfd = opendir(STAGE, rootfd)
    rules = Rules()
    try:
        feed = Feed()
        tree = Tree(sfd)
        try:
            tar = tarfile.open(fileobj=feed, mode="r:", encoding="utf-8", errors="surrogateescape")
            while True:
                m = tar.next()
                if m is None:
                    break
                tar.members = []
                if tar.pax_headers:
                    raise Refused("global_header", m.name, "global PAX headers are refused")
                rel, kind = rules.check(m, tar.offset - m.offset_data)
                tree.add(tar, m, rel, kind)
            while True:
                rest = feed.piece(CH)
                if not rest:
                    break
                if rest.count(0) != len(rest):
                    raise Refused("corrupt", None, "data after the end of the archive")
        except (tarfile.TarError, EOFError, ValueError, struct.error) as exc:
            text = str(exc)
            rule = "truncated" if "unexpected end" in text else "corrupt"
            raise Refused(rule, None, "the archive is %s (%s)" % (rule, text[:300]))
        if not feed.done:
            raise Refused("corrupt", None, "the stream did not end where the archive ends")
        tree.finish()
        if feed.inp.read(1) != b"C":
            raise Refused("aborted", None, "the host did not confirm the stream; nothing was changed")
        swap(rootfd, sfd)
        tree.settle(rootfd)
    except BaseException:
        try:
            rmtree(STAGE, rootfd)
        except OSError:
            pass
        raise
    os.rmdir(STAGE, dir_fd=rootfd)
    print(json.dumps({"ok": True, "files": rules.files, "entries": rules.entries, "bytes": rules.stored}))


try:
    main()
except Refused as exc:
    report(exc.rule, exc.member, exc.message)
except OSError as exc:
    rule, message = oserror(exc)
    if rule == "no_space":
        message = ("the workspace is full: a restore holds the old and the new files at once "
                   "while it stages (%s)" % message)
    report(rule, None, message)
"""
)

#: Prints one JSON line [path, size, sha256] per regular file below
#: A["base"] whose workspace-relative path matches A["regex"].
_HASHER = (
    _COMMON
    + r"""
import hashlib, re
RX = re.compile(A["regex"], re.S)
found = [0]


def digest(dfd, name):
    fd = os.open(name, DIRF, dir_fd=dfd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        h = hashlib.sha256()
        size = 0
        while True:
            buf = os.read(fd, CH)
            if not buf:
                return size, h.hexdigest()
            size += len(buf)
            h.update(buf)
    finally:
        os.close(fd)


def walk(dfd, rel):
    for name in sorted(os.listdir(dfd)):
        if not rel and name.startswith(RESERVED):
            continue
        path = rel + "/" + name if rel else name
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                fd = opendir(name, dfd)
                try:
                    walk(fd, path)
                finally:
                    os.close(fd)
            elif stat.S_ISREG(st.st_mode) and RX.fullmatch(path):
                got = digest(dfd, name)
                if got is None:
                    continue
                found[0] += 1
                if found[0] > A["max_files"]:
                    limit = A["max_files"]
                    raise Refused("entries", path, "more than %d files match; narrow the pattern" % limit)
                sys.stdout.write(json.dumps([path, got[0], got[1]]) + "\n")
        except FileNotFoundError:
            pass


try:
    fd = opendir(A["root"])
    rel = ""
    for p in [p for p in A["base"].split("/") if p]:
        try:
            fd = opendir(p, fd)
        except (FileNotFoundError, NotADirectoryError):
            sys.exit(0)
        rel = rel + "/" + p if rel else p
    walk(fd, rel)
    sys.stdout.flush()
except Refused as exc:
    sys.stdout.flush()
    report(exc.rule, exc.member, exc.message)
except OSError as exc:
    rule, message = oserror(exc)
    report(rule, None, message)
"""
)


def _argv(code: str, args: dict[str, Any]) -> list[str]:
    return ["python3", "-I", "-S", "-c", code, json.dumps(args)]


# -- driving the programs ----------------------------------------------------------------


def _timeout_for(nbytes: int) -> float:
    # A generous floor plus time per MiB at a slow 4 MiB/s: a bound for a
    # hung program, not a performance expectation.
    return 120.0 + nbytes / (4 * MiB)


class _Program:
    """One of the programs above, running in a sandbox through an ExecHandle."""

    def __init__(
        self,
        sandbox: Sandbox,
        code: str,
        args: dict[str, Any],
        *,
        stdin: bool,
        max_output: int,
        budget: int,
    ) -> None:
        self.sandbox = sandbox
        timeout = _timeout_for(budget)
        self.deadline = sandbox._wait_deadline(timeout)
        self.err = bytearray()
        self.exit: RawExit | None = None
        try:
            self.handle: ExecHandle = sandbox._ch().start_exec(
                _argv(code, args),
                env={},
                # The agent's workspace: every program works below "." there.
                cwd=None,
                timeout=timeout,
                max_output=max_output,
                keep_stdin_open=stdin,
            )
        except ChannelError as exc:
            raise sandbox._lost(exc) from None

    def pull(self) -> bytes:
        """The next chunk of stdout; ``b""`` once the program has exited."""
        while self.exit is None:
            try:
                event = self.handle.next_event(self.deadline)
            except ChannelError as exc:
                raise self.sandbox._lost(exc) from None
            if isinstance(event, tuple):
                fd, data = event
                if fd == 1:
                    return data
                room = _ERR_MAX - len(self.err)
                if room > 0:
                    self.err += data[:room]
            else:
                self.exit = event
        return b""

    def write(self, data: bytes, *, eof: bool = False) -> None:
        try:
            self.handle.write_stdin(data, eof=eof)
        except ChannelError as exc:
            raise self.sandbox._lost(exc) from None

    def wait(self) -> RawExit:
        while self.exit is None:
            self.pull()
        return self.exit

    def cancel(self) -> None:
        """Kill the program's process tree and stop listening to it."""
        if self.exit is None:
            self.handle.cancel()
            self.handle.abandon()

    def notes(self) -> list[dict[str, Any]]:
        found = []
        for line in bytes(self.err).decode("utf-8", "replace").splitlines():
            if line.startswith(_MARK):
                with contextlib.suppress(ValueError):
                    doc = json.loads(line[len(_MARK) :])
                    if isinstance(doc, dict):
                        found.append(doc)
        return found

    def failure(self, what: str) -> SnapshotError:
        """The error a program that did not succeed stands for."""
        raw = self.exit
        redact = self.sandbox._guard.redact  # file names are the sandbox's, secrets included
        for doc in self.notes():
            if "rule" in doc:
                member = doc.get("member")
                return _refuse(
                    redact(member) if isinstance(member, str) else None,
                    str(doc.get("rule"))[:40],
                    redact(f"{what}: {str(doc.get('message'))[:1000]}"),
                )
        if raw is not None and raw.timed_out:
            return _refuse(None, "timeout", f"{what} took too long and was stopped")
        tail = bytes(self.err).decode("utf-8", "replace").strip()[-800:]
        code = raw.code if raw is not None else "?"
        return _refuse(None, "failed", f"{what} failed (exit {code}): {redact(tail)}")

    def check(self, what: str) -> None:
        """Raise unless the program exited 0 with all of its output delivered."""
        raw = self.wait()
        if raw.code != 0 or raw.timed_out:
            raise self.failure(what)
        if self.handle.truncated or raw.truncated:
            raise _refuse(None, "size", f"{what}: the stream exceeded its limit")

    def skipped(self) -> list[str]:
        for doc in self.notes():
            names = doc.get("skipped")
            if isinstance(names, list):
                return [str(n)[:MAX_NAME_BYTES] for n in names][:1000]
        return []


class _Feeder:
    """Feeds an extractor's stdin: length-prefixed chunks under flow control."""

    def __init__(self, program: _Program) -> None:
        self.program = program
        self.sent = 0
        self.acked = 0
        self._lines = bytearray()
        self.final: dict[str, Any] | None = None

    def send(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            piece, view = view[:_PIECE], view[_PIECE:]
            while self.sent - self.acked > ACK_WINDOW:
                if not self._pump():
                    raise self.program.failure("the extractor")
            self.program.write(struct.pack(">I", len(piece)) + piece)
            self.sent += 4 + len(piece)

    def _pump(self) -> bool:
        chunk = self.program.pull()
        if not chunk:
            return False
        self._lines += chunk
        while True:
            end = self._lines.find(b"\n")
            if end < 0:
                break
            line = bytes(self._lines[:end])
            del self._lines[: end + 1]
            if line.startswith(b"a "):
                with contextlib.suppress(ValueError):
                    self.acked = max(self.acked, int(line[2:]))
            elif line.startswith(b"{"):
                with contextlib.suppress(ValueError):
                    doc = json.loads(line)
                    if isinstance(doc, dict):
                        self.final = doc
        if len(self._lines) > 64 * 1024:
            raise _refuse(None, "failed", "the extractor wrote an overlong line")
        return True

    def finish(self, *, commit: bool) -> dict[str, Any]:
        """End the stream; on ``commit`` the extractor swaps the new files in."""
        if self.program.exit is None:
            self.program.write(struct.pack(">I", 0) + (b"C" if commit else b"A"), eof=True)
        while self._pump():
            pass
        raw = self.program.wait()
        if raw.code != 0 or self.final is None or self.final.get("ok") is not True:
            raise self.program.failure("the extractor")
        return self.final

    def abort(self) -> None:
        """Best effort: tell the extractor to drop what it staged, and wait for it."""
        if self.program.exit is not None:
            return
        try:
            self.finish(commit=False)
        except (AgentNestError, OSError):
            self.program.cancel()


def _writer_args(sandbox: Sandbox, *, sub: str = "", prefix: str = PAYLOAD_PREFIX) -> dict[str, Any]:
    return {
        "root": ".",
        "sub": sub,
        "prefix": prefix,
        "max_bytes": sandbox.config.limits.workspace,
        "max_entries": MAX_ENTRIES,
    }


def _start_writer(sandbox: Sandbox, args: dict[str, Any]) -> _Program:
    """Start the tar writer; with ``args["wait"]`` it waits for :func:`_go` first."""
    # The agent's output limit is a backstop; the rules bound the stream first.
    limit = int(args["max_bytes"]) + MAX_ENTRIES * 2048
    return _Program(
        sandbox, _WRITER, args, stdin=bool(args.get("wait")), max_output=limit, budget=int(args["max_bytes"])
    )


def _start_extractor(sandbox: Sandbox, max_bytes: int) -> tuple[_Program, _Feeder]:
    args = {
        "root": ".",
        "token": os.urandom(6).hex(),
        "prefix": PAYLOAD_PREFIX,
        "max_bytes": max_bytes,
        "max_entries": MAX_ENTRIES,
        "max_file": MAX_FILE_SIZE,
        "ack": ACK_EVERY,
    }
    program = _Program(sandbox, _EXTRACTOR, args, stdin=True, max_output=MiB, budget=max_bytes)
    return program, _Feeder(program)


def _require(sandbox: Sandbox, capability: Capability, what: str) -> None:
    if capability not in sandbox.backend.capabilities():
        raise UnsupportedCapabilityError(
            f"the {sandbox.backend.name!r} backend does not support {what} (capability {capability.value!r})"
        )


# -- operations --------------------------------------------------------------------------


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

            writer = _start_writer(sandbox, _writer_args(sandbox))
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


class _Digest:
    """SHA-256 of a stream; :meth:`mark` gives the digest so far while it goes on.

    (A helper thread for the hash was measured and gained nothing: with two
    CPUs shared by dockerd, the agents and the programs, there is no idle core.)
    """

    def __init__(self) -> None:
        self._hash = hashlib.sha256()

    def update(self, data: bytes | memoryview) -> None:
        self._hash.update(data)

    def mark(self) -> str:
        return self._hash.copy().hexdigest()

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def close(self) -> None:
        pass


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

        yield _SnapshotFile(read_chunk, compressed, st.st_size, hashing)


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
    with _open_snapshot(path) as snap:
        program, feeder = _start_extractor(sandbox, max_bytes)
        try:
            # The extractor stages everything; it swaps only on commit, which
            # it gets only if the whole file checked out.
            doc, whole, _ = _read_snapshot_file(snap, TarRules(max_bytes=max_bytes), feeder.send)
            feeder.send(bytes(2 * tarfile.BLOCKSIZE))  # the end marker the host kept back
        except BaseException as exc:
            if isinstance(exc, Exception):
                feeder.abort()
            else:
                program.cancel()
            raise
        feeder.finish(commit=True)
    meta = _metadata(doc, Path(os.fspath(path)), snap.size, whole, snap.compressed)
    guard.emit(
        EventType.SNAPSHOT_RESTORED,
        {"path": str(meta.path), "sha256": meta.sha256, "files": meta.files, "size": meta.size},
    )
    return meta


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


def fork(parent: Sandbox, *, timeout: float | None = None) -> Sandbox:
    """Branch ``parent`` into a new sandbox.  See :meth:`Sandbox.fork`."""
    parent._ch()  # raises SandboxDestroyedError for a destroyed parent
    _require(parent, Capability.FORK, "fork")
    config = parent.config
    guard = parent._guard
    lifetime = config.lifetime if timeout is None else timeout
    guard.approve("fork", {"image": config.image, "timeout": lifetime})
    limits = config.limits
    # The parent's writer starts now and waits for a go: its interpreter
    # starts while the child's container does.  No data flows before the go,
    # so nothing piles up in the parent's channel meanwhile.
    writer = _start_writer(parent, {**_writer_args(parent), "wait": True})
    try:
        child = _create_like(parent, lifetime)
    except BaseException:
        writer.cancel()
        raise
    try:
        # Secrets passed to single commands may be in the files: the child
        # redacts everything the parent does.
        for secret in guard.secrets:
            child._guard.add_secret(secret)
        try:
            program, feeder = _start_extractor(child, limits.workspace)
        except BaseException:
            writer.cancel()
            raise
        try:
            try:
                writer.write(b"g", eof=True)
                rules = TarRules(max_bytes=limits.workspace)
                _read_program(writer, _Gate(writer.pull, feeder.send), rules)
                writer.check("the fork's tar writer")
            except BaseException:
                writer.cancel()
                raise
            # A stream without the metadata member still needs its end marker.
            feeder.send(bytes(2 * tarfile.BLOCKSIZE))
        except BaseException as exc:
            if isinstance(exc, Exception):
                feeder.abort()
            else:
                program.cancel()
            raise
        feeder.finish(commit=True)
    except BaseException:
        child.destroy()
        raise
    details = {"files": rules.files, "size": rules.size, "skipped": writer.skipped()}
    guard.emit(EventType.SANDBOX_FORKED, {"child": child.id, **details})
    child._guard.emit(EventType.SANDBOX_FORKED, {"parent": parent.id, **details})
    return child


def _create_like(parent: Sandbox, lifetime: float) -> Sandbox:
    """A new sandbox with the parent's configuration, backend and hooks."""
    config = parent.config
    guard = parent._guard
    limits = config.limits
    return type(parent)(
        config.image,
        lifetime,
        environment=dict(config.environment),
        workdir=config.workdir,
        network_enabled=config.network != guard.policy.network,
        memory=limits.memory,
        cpus=limits.cpus,
        pids=limits.pids,
        gpus=limits.gpus,
        workspace_size=limits.workspace,
        scratch_size=limits.scratch,
        backend=parent.backend,
        read_only_root=config.read_only_root,
        security_policy=guard.policy,
        observers=guard.observers,
        approval_hook=guard.approval_hook,
    )


def artifacts(sandbox: Sandbox, pattern: str = "**/*") -> tuple[Artifact, ...]:
    """Regular files matching ``pattern``, hashed in the sandbox.  See :meth:`Sandbox.artifacts`."""
    workdir = sandbox.config.workdir.rstrip("/")
    if isinstance(pattern, str) and pattern.startswith("/"):
        if pattern != workdir and not pattern.startswith(workdir + "/"):
            raise ConfigurationError(f"the pattern {pattern!r} is outside the workspace {workdir}")
        pattern = pattern[len(workdir) :].lstrip("/") or "**"
    base, regex = glob_to_regex(pattern)
    sandbox._ch()
    sandbox._guard.approve("file.list", {"pattern": pattern})
    return tuple(_artifacts(sandbox, base, regex, pattern))


def _artifacts(sandbox: Sandbox, base: str, regex: str, pattern: str) -> Iterator[Artifact]:
    compiled = re.compile(regex, re.S)
    args = {"root": ".", "base": base, "regex": regex, "max_files": MAX_ARTIFACTS}
    program = _Program(
        sandbox, _HASHER, args, stdin=False, max_output=64 * MiB, budget=sandbox.config.limits.workspace
    )
    buffer = bytearray()
    count = 0
    try:
        while True:
            chunk = program.pull()
            if not chunk:
                break
            buffer += chunk
            while True:
                end = buffer.find(b"\n")
                if end < 0:
                    break
                line = bytes(buffer[:end])
                del buffer[: end + 1]
                count += 1
                if count > MAX_ARTIFACTS:
                    raise FileAccessError(f"more than {MAX_ARTIFACTS} files match", code="too_many")
                found = _artifact(line, compiled)
                # File names come from the sandbox: they may spell a secret.
                yield dataclasses.replace(found, path=sandbox._guard.redact(found.path))
            if len(buffer) > 3 * MAX_NAME_BYTES + 200:
                raise ChannelError("the hasher sent an overlong line")
        try:
            program.check("listing artifacts")
        except SnapshotError as exc:
            raise FileAccessError(str(exc), path=exc.member, code=exc.rule) from None
        if buffer:
            raise ChannelError("the hasher's output ended mid-line")
    finally:
        program.cancel()
    sandbox._guard.emit(EventType.FILE_READ, {"pattern": pattern, "files": count})


def _artifact(line: bytes, compiled: re.Pattern[str]) -> Artifact:
    """Parse and check one line of the hasher's output (untrusted)."""
    try:
        path, size, sha = json.loads(line)
    except (ValueError, TypeError):
        raise ChannelError("the hasher sent an invalid line") from None
    if (
        not isinstance(path, str)
        or not path
        or path.startswith("/")
        or "\x00" in path
        or _nbytes(path) > MAX_NAME_BYTES
        or any(p in ("", ".", "..") for p in path.split("/"))
        or not compiled.fullmatch(path)
        or not _is_count(size)
        or not isinstance(sha, str)
        or not _HEX64.fullmatch(sha)
    ):
        raise ChannelError("the hasher sent an invalid entry")
    return Artifact(path, size, sha)


def download(sandbox: Sandbox, path: str, dest: str | os.PathLike[str]) -> Path:
    """Copy a workspace file or tree into a host directory.  See :meth:`Sandbox.download`."""
    guard = sandbox._guard
    rel = guard.workspace_path(path)
    target_dir = Path(os.fspath(dest))
    sandbox._ch()
    guard.approve("file.read", {"path": guard.absolute(rel), "dest": str(target_dir)})
    name = rel.rsplit("/", 1)[-1]
    prefix = name or PAYLOAD_PREFIX
    try:
        target_dir.mkdir(parents=True, exist_ok=True)
        tree = _HostTree(target_dir, strip=not name)
    except OSError as exc:
        raise FileAccessError(
            f"cannot use {str(target_dir)!r} as the destination: {exc}", code="io"
        ) from None
    try:
        writer = _start_writer(sandbox, _writer_args(sandbox, sub=rel, prefix=prefix))
        try:
            rules = TarRules(
                max_bytes=sandbox.config.limits.workspace, prefix=prefix, symlinks=False, root_file=True
            )
            _read_program(writer, _Gate(writer.pull, None), rules, on_member=tree.add)
            writer.check(f"downloading {rel or '.'!r}")
        except BaseException:
            writer.cancel()
            raise
    except SnapshotError as exc:
        raise FileAccessError(str(exc), path=exc.member or path, code=exc.rule) from None
    finally:
        tree.close()
    guard.emit(EventType.FILE_READ, {"path": rel, "size": rules.size, "files": rules.files})
    return target_dir / name if name else target_dir


class _HostTree:
    """Writes validated members below a host directory, never outside it.

    Every directory is opened relative to its parent with ``O_NOFOLLOW``,
    so a symlink already in the destination is refused, not followed; files
    are written to a temporary name and renamed over the target (a rename
    replaces a link, it never writes through one).  Modes keep at most
    ``0o755``: no setuid, setgid, sticky or world-writable file reaches the host.
    """

    _DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

    def __init__(self, dest: Path, *, strip: bool) -> None:
        self._strip = strip
        self._root = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._parts: tuple[str, ...] = ()
        self._fd = self._root

    def close(self) -> None:
        if self._fd != self._root:
            os.close(self._fd)
        os.close(self._root)
        self._fd = self._root = -1

    def _parent(self, parts: list[str]) -> int:
        want = tuple(parts[:-1])
        if want == self._parts:
            return self._fd
        if self._fd != self._root:
            os.close(self._fd)
        self._parts, self._fd = (), self._root
        fd = self._root
        try:
            for part in want:
                try:
                    nfd = os.open(part, self._DIR, dir_fd=fd)
                except FileNotFoundError:
                    os.mkdir(part, 0o755, dir_fd=fd)
                    nfd = os.open(part, self._DIR, dir_fd=fd)
                if fd != self._root:
                    os.close(fd)
                fd = nfd
        except OSError as exc:
            if fd != self._root:
                os.close(fd)
            raise _host_error(exc, "/".join(parts)) from None
        self._parts, self._fd = want, fd
        return fd

    def add(self, tar: tarfile.TarFile, member: tarfile.TarInfo, rel: list[str], kind: str) -> None:
        parts = rel if self._strip else [member.name.split("/", 1)[0], *rel]
        if not parts:
            return
        pfd = self._parent(parts)
        name = parts[-1]
        if kind == "dir":
            try:
                os.mkdir(name, 0o755, dir_fd=pfd)
            except FileExistsError:
                try:
                    os.close(os.open(name, self._DIR, dir_fd=pfd))
                except OSError as exc:
                    raise _host_error(exc, "/".join(parts)) from None
            except OSError as exc:
                raise _host_error(exc, "/".join(parts)) from None
            return
        tmp = f".{name[:200]}.agentnest-{os.getpid()}-{os.urandom(4).hex()}.tmp"
        try:
            fd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=pfd
            )
        except OSError as exc:
            raise _host_error(exc, "/".join(parts)) from None
        try:
            try:
                src = cast(IO[bytes], tar.fileobj)
                sparse = cast("list[tuple[int, int]] | None", member.sparse)
                if sparse is None:
                    _copy_out(src, fd, member.size, member.name)
                else:
                    for offset, length in sparse:
                        os.lseek(fd, offset, os.SEEK_SET)
                        _copy_out(src, fd, length, member.name)
                    os.ftruncate(fd, member.size)
                os.fchmod(fd, member.mode & 0o755)
                os.utime(fd, (member.mtime, member.mtime))
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=pfd)
            if isinstance(exc, OSError):
                raise _host_error(exc, "/".join(parts)) from None
            raise


def _copy_out(src: IO[bytes], fd: int, n: int, member: str) -> None:
    while n:
        data = src.read(min(MiB, n))
        if not data:
            raise _refuse(member, "truncated", "the member's data is truncated")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        n -= len(data)


def _host_error(exc: OSError, where: str) -> FileAccessError:
    import errno

    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return FileAccessError(
            f"{where!r}: a symlink or a file is in the way in the destination; it is not followed",
            path=where,
            code="symlink",
        )
    return FileAccessError(f"{where!r}: {exc.strerror or exc}", path=where, code="io")
