"""``agentnest setup``: make the storage pool that disk workspaces live in (as root, idempotent)."""

from __future__ import annotations

import argparse

from ._output import Commands, add_command

_EPILOG = """\
Makes, once, a sparse file (by default half the free disk, at most 256g;
it costs only what sandboxes write), formats it btrfs, mounts it with
quotas on at /var/lib/agentnest/storage ($AGENTNEST_STORAGE), and checks
it.  Run again after a reboot to mount it again; nothing is lost.  Needs
root (a loop mount and btrfs quotas) and btrfs-progs.  Without a pool,
workspaces live in memory (workspace="memory").  See docs/state.md.

examples:
  sudo agentnest setup
  sudo agentnest setup --size 100g
  agentnest doctor                   # shows the pool's free space
"""


def register(commands: Commands) -> None:
    """Add ``setup`` to the command line."""
    parser = add_command(
        commands,
        "setup",
        "make the storage pool for disk workspaces (root)",
        "Make and mount the storage pool that disk-backed workspaces live in.",
        _EPILOG,
    )
    parser.add_argument("--size", metavar="SIZE", help="size of a new pool file, e.g. 100g")
    parser.add_argument(
        "--path",
        metavar="DIR",
        help="mount point (default: $AGENTNEST_STORAGE or /var/lib/agentnest/storage)",
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    """Make (or check) the pool and print where it is."""
    from ..config import parse_size
    from ..runtime import storage

    size = parse_size(args.size, "--size") if args.size else None
    status, steps = storage.setup(args.path, size=size)
    for step in steps:
        print(f"setup: {step}")
    if not status.ready:
        print(f"setup: the pool at {status.root} is not usable: {status.detail}")
        return 1
    print(
        f"storage pool ready at {status.root}: {storage.human_size(status.free)} free of "
        f"{storage.human_size(status.size)}, {status.workspaces} workspace(s)"
    )
    return 0
