"""gVisor checkpoints through Docker's experimental API: pause to disk, resume, (later) live fork.

What works with Docker 20.10 and runsc 20221219 (docs/state.md has the
measurements): ``POST /containers/{id}/checkpoints`` with ``Exit`` stops the
container into ``<DockerRootDir>/containers/<id>/checkpoints/<name>``, and
``POST /containers/{id}/start?checkpoint=<name>`` restores it into the same
container.  Two workarounds are needed, both explained where they are made:

* a nonce file is written into the checkpoint directory before each restore
  (Docker uploads the directory into containerd's content store, and a
  restore soon after the checkpoint fails with "content ... already exists",
  moby/moby#42900);
* the restored agent is woken with SIGUSR2 (its selector's registration of
  fd 0 does not survive the restore; see ``agent/loop.py``).

Only for an engine on this host (the checkpoint directory is read and
written here) that reports ``ExperimentalBuild``.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path
from typing import Any

from ...errors import BackendError, SnapshotError

# ``api`` below is a docker.APIClient; the checkpoint endpoints have no
# public docker-py method, so its request helpers (_post, _url...) are used,
# which its type stubs do not declare.

#: The checkpoint a paused sandbox is stopped into (one per container).
PAUSE_NAME = "agentnest-pause"
#: The checkpoint a live fork stops its parent into.
FORK_NAME = "agentnest-fork"
#: The file runsc writes (and reads back) in a checkpoint directory.
IMAGE_FILE = "checkpoint.img"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def supported(info: dict[str, Any]) -> bool:
    """Whether the engine (its ``docker info``) can checkpoint: experimental, root dir reachable here."""
    root = info.get("DockerRootDir")
    return bool(info.get("ExperimentalBuild")) and isinstance(root, str) and os.access(root, os.W_OK)


def directory(info: dict[str, Any], cid: str, name: str) -> Path:
    """Where the engine keeps checkpoint ``name`` of container ``cid``."""
    if not _NAME.match(name) or not re.fullmatch(r"[0-9a-f]{64}", cid):
        raise BackendError(f"invalid checkpoint name {name!r} or container id {cid!r:.80}")
    return Path(str(info["DockerRootDir"])) / "containers" / cid / "checkpoints" / name


def create(api: Any, cid: str, name: str) -> None:
    """Checkpoint the container and stop it (runsc cannot leave it running here)."""
    response = api._post_json(
        api._url("/containers/{0}/checkpoints", cid), data={"CheckpointID": name, "Exit": True}
    )
    _check(response, "checkpointing the sandbox")
    # The engine records the exit after it answers: wait for it (seen here
    # as "running" for a moment), so that a restore never meets a running container.
    deadline = time.monotonic() + 30.0
    while api.inspect_container(cid)["State"].get("Running"):
        if time.monotonic() > deadline:
            raise BackendError("checkpointing the sandbox: the container did not stop within 30 s")
        time.sleep(0.01)  # polls the engine's state; the exit is the signal


def restore(api: Any, info: dict[str, Any], cid: str, name: str) -> None:
    """Start the stopped container from its checkpoint ``name``.

    Raises:
        SnapshotError: the checkpoint is missing, empty or refused by runsc
            (corrupt, truncated, or from another gVisor version).
    """
    where = directory(info, cid, name)
    image = where / IMAGE_FILE
    try:
        size = image.stat().st_size
    except OSError:
        raise SnapshotError(
            f"the checkpoint {name!r} of this sandbox is missing ({image}); its processes cannot be "
            "restored: destroy() the sandbox (its workspace is in the storage pool until then)",
            rule="checkpoint",
        ) from None
    if size == 0:
        raise SnapshotError(
            f"the checkpoint {name!r} of this sandbox is empty (truncated); destroy() the sandbox",
            rule="checkpoint",
        )
    # Docker uploads the directory to containerd's content store before the
    # restore; a directory whose digest is already there (a restore soon
    # after the checkpoint) fails with "already exists" (moby/moby#42900).
    # A fresh nonce gives every upload its own digest.  runsc reads only
    # its image file.  0o600: the directory is root's, and so is this file.
    fd = os.open(where / "agentnest-nonce", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, os.urandom(16).hex().encode())
    finally:
        os.close(fd)
    response = api._post(api._url("/containers/{0}/start", cid), params={"checkpoint": name})
    if response.status_code >= 400:
        text = _text(response)
        raise SnapshotError(
            f"the sandbox could not be restored from its checkpoint {name!r} (corrupt, truncated, or "
            f"written by another gVisor version?): {text}; destroy() it (its files stay in the pool "
            "until then)",
            rule="checkpoint",
        )


def copy(source: Path, target: Path) -> None:
    """Put checkpoint ``source`` (another container's) at ``target``: hard links, else a copy.

    Only regular files are taken (no links, nothing else); runsc only
    reads them, and a later pause of the source unlinks its own names.
    """
    import shutil

    target.mkdir(parents=True, mode=0o700, exist_ok=True)
    for entry in os.scandir(source):
        if not entry.is_file(follow_symlinks=False) or entry.name == "agentnest-nonce":
            continue
        try:
            os.link(entry.path, target / entry.name)
        except OSError:
            shutil.copyfile(entry.path, target / entry.name, follow_symlinks=False)


def wake(api: Any, cid: str, pid: int, user: str) -> None:
    """Tell the restored agent (``pid``) to look at its stdin again (SIGUSR2; see agent/loop.py)."""
    # The sandbox's own user: it may signal its own processes, and nothing more.
    exec_id = api.exec_create(cid, ["/bin/sh", "-c", f"kill -USR2 {int(pid)}"], user=user)["Id"]
    api.exec_start(exec_id)


def delete(api: Any, cid: str, name: str) -> None:
    """Remove the checkpoint (best effort: a removed container took it along)."""
    with contextlib.suppress(Exception):  # cleanup only: an absent checkpoint is fine
        api._delete(api._url("/containers/{0}/checkpoints/{1}", cid, name))


def _check(response: Any, what: str) -> None:
    if response.status_code >= 400:
        raise BackendError(f"{what}: the engine refused: {_text(response)}")


def _text(response: Any) -> str:
    try:
        body = response.json()
        message = body.get("message") if isinstance(body, dict) else None
    except ValueError:
        message = None
    return str(message or response.text or response.status_code)[:500]
