"""The snapshot format's constants and the extraction rules: pure checks, no I/O.

The package docstring (:mod:`agentnest.state`) describes the format and the rules.
"""

from __future__ import annotations

import re
import tarfile
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


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
