"""The snapshot format's constants, the extraction rules and the stream gate: pure checks, no I/O.

The package docstring (:mod:`agentnest.state`) describes the format and the rules.
"""

from __future__ import annotations

import json
import re
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from ..errors import ConfigurationError, SnapshotError

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
#: Most matching files ``artifacts`` reports.
MAX_ARTIFACTS = 100_000
#: Names at the top of the workspace that restores use for staging; never archived.
STAGING_PREFIX = ".agentnest-restore-"
TRASH_PREFIX = ".agentnest-old-"
_RESERVED = (STAGING_PREFIX, TRASH_PREFIX)
#: A SHA-256 digest in hex, as the metadata and the hasher give it.
_HEX64 = re.compile(r"[0-9a-f]{64}")
_Sink = Callable[[memoryview], object]


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


def glob_parts(pattern: str) -> list[str]:
    """A workspace glob's components (empty, overlong or ``..`` refused): a walk below stays inside."""
    if not isinstance(pattern, str) or not pattern or "\x00" in pattern or len(pattern) > MAX_NAME_BYTES:
        raise ConfigurationError("the pattern must be a non-empty string of at most 4096 characters")
    parts = [p for p in pattern.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ConfigurationError(f"the pattern {pattern!r} climbs out of the workspace with '..'")
    return parts or ["**"]


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


# -- the stream gate (pure) ----------------------------------------------------------------


class _Valve:
    """The stream gate's decision: only the bytes of members the rules accepted pass on.

    The gate (:class:`agentnest.state.archive._Gate`, the file object :mod:`tarfile`
    reads) feeds it every byte it consumes, in order; only this class reaches ``sink``.
    Bytes the parser has read beyond the last validated member (the next member's
    headers) are held back until that member is validated too, at most :data:`HOLD_LIMIT`
    of them.  ``allow(offset)`` releases everything below ``offset``; with ``drop=True``
    it is discarded instead of passed on (the metadata member of a snapshot).
    """

    def __init__(self, sink: _Sink | None, dropped: _Sink | None) -> None:
        self._sink = sink
        self._dropped = dropped
        self._held = bytearray()
        self.position = 0
        """Bytes consumed from the source."""
        self._base = 0
        self._limit = 0
        self._drop = False

    def feed(self, view: memoryview) -> None:
        """The next bytes of the stream: passed on at once if allowed already, else held."""
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

    def trailer(self, unread: Callable[[bytearray], bytes]) -> bytes:
        """What follows the archive (held bytes, then ``unread`` adds the rest): to ``dropped`` only."""
        data = unread(self._held)
        self._held = bytearray()
        if self._dropped is not None:
            self._dropped(memoryview(data))
        return data


@dataclass
class _Stream:
    """What came through one archive stream; the order of its members and its end, checked.

    In a ``snapshot_file`` the metadata member, if any, is last (``on_metadata`` runs when it starts).
    """

    rules: TarRules
    valve: _Valve
    snapshot_file: bool = False
    on_metadata: Callable[[], None] | None = None
    metadata: dict[str, Any] | None = None
    payload: int = 0
    """Bytes of the payload (everything before the metadata member)."""
    last: str | None = None
    """The last member checked (the metadata member aside)."""

    def admit(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> tuple[list[str], str] | None:
        """Check ``member`` and release its bytes: its path and kind, ``None`` for the metadata member."""
        if tar.pax_headers:
            raise _refuse(member.name, "global_header", "global PAX headers are refused")
        if self.metadata is not None:
            raise _refuse(member.name, "metadata", f"a member follows {METADATA_NAME!r}, which must be last")
        span = tar.offset - member.offset_data
        if self.snapshot_file and member.name == METADATA_NAME:
            self.payload = member.offset
            if self.on_metadata is not None:
                self.on_metadata()
            self.valve.allow(tar.offset, drop=True)
            self.metadata = _read_metadata(tar, member)
            return None
        checked = self.rules.check(member, span)
        self.last = member.name
        self.valve.allow(tar.offset)
        return checked

    def end(self, trailer: bytes) -> None:
        """Check what follows the last member: a snapshot file's end marker, nothing after a writer's."""
        last = self.last
        if not self.snapshot_file:
            if trailer:
                raise _refuse(
                    None, "corrupt", f"the stream has bytes after member {last!r} that are not a member"
                )
            return
        if trailer.count(0) != len(trailer):
            if len(trailer) < tarfile.BLOCKSIZE:
                raise _refuse(None, "truncated", f"the archive is truncated after member {last!r}")
            raise _refuse(None, "corrupt", f"the data after member {last!r} is not a valid tar header")
        if len(trailer) > MAX_TRAILER_BYTES:
            raise _refuse(
                None, "corrupt", f"more than {MAX_TRAILER_BYTES} bytes follow the end of the archive"
            )
        # A tar without the metadata member (a 0.3.0 snapshot, or `tar -cf x.tar
        # workspace`) is accepted: every member is still checked, and a complete
        # end-of-archive marker proves it is not truncated; only the checksum is missing.
        if len(trailer) < 2 * tarfile.BLOCKSIZE:
            raise _refuse(None, "truncated", "the archive is truncated: its end-of-archive marker is missing")

    def verify(self, digest: str) -> None:
        """Check the metadata, if any, against the payload's SHA-256 and the counts of the rules."""
        meta = self.metadata
        if meta is None:
            return
        if meta["sha256"] != digest:
            raise _refuse(
                None, "checksum", "the payload's SHA-256 does not match the metadata: the file was altered"
            )
        counted = {"files": self.rules.files, "entries": self.rules.entries, "size": self.rules.size}
        for key, value in counted.items():
            if meta[key] != value:
                raise _refuse(
                    None, "checksum", f"the metadata says {key}={meta[key]}, the archive has {value}"
                )


def _stream_error(exc: BaseException, after: str | None = None) -> SnapshotError:
    text = str(exc) or type(exc).__name__
    where = f" in or after member {after!r}" if after else ""
    if isinstance(exc, EOFError) or "unexpected end of data" in text or "truncated" in text.lower():
        return _refuse(None, "truncated", f"the archive is truncated{where} ({text[:300]})")
    return _refuse(None, "corrupt", f"the archive is corrupt{where} ({text[:300]})")


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
        newer = f"snapshot format {version} is newer than this AgentNest reads ({FORMAT_VERSION}); "
        raise _refuse(METADATA_NAME, "version", newer + "upgrade agentnest")
    checks: dict[str, Callable[[Any], bool]] = {
        "image": lambda v: isinstance(v, str) and 0 < len(v) <= 512 and not any(c.isspace() for c in v),
        "created": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0,
        "sha256": lambda v: isinstance(v, str) and bool(_HEX64.fullmatch(v)),
        **dict.fromkeys(("size", "files", "entries"), _is_count),
        "sandbox_id": lambda v: isinstance(v, str) and len(v) <= 128,
        "skipped": lambda v: isinstance(v, list) and len(v) <= 1000 and all(isinstance(s, str) for s in v),
    }
    for key, ok in checks.items():
        if not ok(doc.get(key)):
            raise _refuse(METADATA_NAME, "metadata", f"the metadata field {key!r} is missing or invalid")
    return doc


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
