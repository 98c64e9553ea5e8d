"""Workspace state: snapshot, restore, fork, artifacts and download.

Everything here moves through the agent channel, so it works the same when
the engine is remote: small stdlib programs run inside the sandbox (a tar
writer, a safe extractor, a hasher: ``agentnest/agent/tar_writer.py``,
``tar_extract.py`` and ``hasher.py``) through an :class:`ExecHandle`, and the
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

The package, by concern: :mod:`.rules` (the format's constants, the
extraction rules and the stream gate's checks, pure), :mod:`.archive` (the
gate's reader, parsing archives, reading snapshot files), :mod:`.programs`
(running the in-sandbox programs: :class:`~agentnest.state.programs._Program`
is the one interface to them), :mod:`.snapshots` (snapshot, restore), :mod:`.forks`
(fork), :mod:`.paused` (resume from a checkpoint), :mod:`.spares` (warm
spares) and :mod:`.transfer` (artifacts, download).  Each operation takes a
:class:`~agentnest._core.SandboxCore` (never a face); a fork or a resume
returns a new core, which the face wraps.  This module re-exports what the
faces and the tests use.  Tunables are read where they are defined: patch
``agentnest.state.programs.ACK_WINDOW``, not a re-export of it.
"""

from __future__ import annotations

from .archive import _Gate as _Gate
from .archive import _metadata_member as _metadata_member
from .archive import _read_archive as _read_archive
from .forks import fork as fork
from .paused import from_checkpoint as from_checkpoint
from .programs import _EXTRACTOR as _EXTRACTOR
from .programs import _HASHER as _HASHER
from .programs import _MARK as _MARK
from .programs import _PIECE as _PIECE
from .programs import _WRITER as _WRITER
from .programs import ACK_EVERY as ACK_EVERY
from .programs import ACK_WINDOW as ACK_WINDOW
from .programs import _argv as _argv
from .programs import _Feeder as _Feeder
from .programs import _Program as _Program
from .programs import _source as _source
from .rules import FORMAT_NAME as FORMAT_NAME
from .rules import FORMAT_VERSION as FORMAT_VERSION
from .rules import HOLD_LIMIT as HOLD_LIMIT
from .rules import MAX_ARTIFACTS as MAX_ARTIFACTS
from .rules import MAX_COMPONENT_BYTES as MAX_COMPONENT_BYTES
from .rules import MAX_ENTRIES as MAX_ENTRIES
from .rules import MAX_FILE_SIZE as MAX_FILE_SIZE
from .rules import MAX_METADATA_BYTES as MAX_METADATA_BYTES
from .rules import MAX_NAME_BYTES as MAX_NAME_BYTES
from .rules import MAX_SPARSE_SEGMENTS as MAX_SPARSE_SEGMENTS
from .rules import MAX_TRAILER_BYTES as MAX_TRAILER_BYTES
from .rules import METADATA_NAME as METADATA_NAME
from .rules import PAYLOAD_PREFIX as PAYLOAD_PREFIX
from .rules import STAGING_PREFIX as STAGING_PREFIX
from .rules import TRASH_PREFIX as TRASH_PREFIX
from .rules import MiB as MiB
from .rules import TarRules as TarRules
from .rules import symlink_target_ok as symlink_target_ok
from .snapshots import read_snapshot as read_snapshot
from .snapshots import restore as restore
from .snapshots import snapshot as snapshot
from .spares import SPARES as SPARES
from .transfer import artifacts as artifacts
from .transfer import download as download
from .transfer import glob_to_regex as glob_to_regex

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
