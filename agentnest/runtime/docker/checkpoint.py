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

A sandbox paused to disk outlives the process that paused it: a *record*
(:func:`write_record`) keeps what another process needs to resume it
(``Sandbox.from_checkpoint``): its configuration, the agent's pid and the
next request id, its workspace, its deadline, and who owns it now (so
``prune --orphans`` leaves a resumable sandbox alone while its deadline
runs).  Records live in :func:`record_dir`, root-only; the configuration in
them holds the sandbox's environment, secrets included, as the engine's own
container configuration does (``config.v2.json``, also root-only).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import BackendError, ConfigurationError, SandboxDestroyedError, SnapshotError
from .. import storage

if TYPE_CHECKING:
    from ...config import SandboxConfig

# ``api`` below is a docker.APIClient; the checkpoint endpoints have no
# public docker-py method, so its request helpers (_post, _url...) are used,
# which its type stubs do not declare.

#: The checkpoint a paused sandbox is stopped into (one per container).
PAUSE_NAME = "agentnest-pause"
#: The checkpoint a live fork stops its parent into.
FORK_NAME = "agentnest-fork"
#: How to destroy a sandbox one has no object for (Sandbox.from_checkpoint failed).
_ELSEWHERE = " (without its object: `agentnest prune --all --sandbox ID`)"
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
        BackendError: the container runs already (another process resumed it).
    """
    where = directory(info, cid, name)
    image = where / IMAGE_FILE
    try:
        size = image.stat().st_size
    except OSError:
        raise SnapshotError(
            f"the checkpoint {name!r} of this sandbox is missing ({image}); its processes cannot be "
            f"restored: destroy() the sandbox{_ELSEWHERE} (its workspace is in the storage pool until then)",
            rule="checkpoint",
        ) from None
    if size == 0:
        raise SnapshotError(
            f"the checkpoint {name!r} of this sandbox is empty (truncated); destroy() it{_ELSEWHERE}",
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
    if response.status_code == 304:
        # "Not modified": the engine restored nothing, the container runs
        # already (another process resumed it: Sandbox.from_checkpoint).
        # Taking it as a success would give its agent a second host.
        raise BackendError(
            "the sandbox is running already: another process resumed it from its checkpoint "
            "(Sandbox.from_checkpoint); only that process can use it now"
        )
    if response.status_code >= 400:
        text = _text(response)
        raise SnapshotError(
            f"the sandbox could not be restored from its checkpoint {name!r} (corrupt, truncated, or "
            f"written by another gVisor version?): {text}; destroy() it{_ELSEWHERE} (its files stay in "
            "the pool until then)",
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


# -- records of sandboxes paused to disk ------------------------------------------------------

#: The record format; a record of another version is refused (resume it with that version).
RECORD_VERSION = 1
_SANDBOX_ID = re.compile(r"[0-9a-f]{12}")  # fullmatch: "$" would take a trailing newline
_MAX_RECORD = 1 << 20


def record_dir() -> Path:
    """Where the records live: ``paused/`` beside the storage pool (``/var/lib/agentnest/paused``)."""
    return Path(storage.pool_root()).parent / "paused"


def _record_path(sandbox_id: str) -> Path:
    if not isinstance(sandbox_id, str) or not _SANDBOX_ID.fullmatch(sandbox_id):
        raise ConfigurationError(f"{sandbox_id!r:.80} is not a sandbox id (12 hex digits, as Sandbox.id)")
    return record_dir() / f"{sandbox_id}.json"


def write_record(sandbox_id: str, doc: dict[str, Any]) -> None:
    """Write (or replace) the record of a sandbox paused to disk: root-only, atomically."""
    path = _record_path(sandbox_id)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Unique per writer: two threads of one process (two from_checkpoint calls)
    # sharing a name would rename each other's file away.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(6).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"version": RECORD_VERSION, **doc}, f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_record(sandbox_id: str) -> dict[str, Any]:
    """The record of a sandbox paused to disk.

    Raises:
        SandboxDestroyedError: there is none (never paused to disk, resumed, or destroyed).
        SnapshotError: it is unreadable or of another version.
    """
    path = _record_path(sandbox_id)
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_RECORD + 1)
    except FileNotFoundError:
        raise SandboxDestroyedError(
            f"no sandbox {sandbox_id} is paused to disk on this host (never paused with pause() on gVisor, "
            "already resumed, or destroyed); `agentnest prune --dry-run` lists what is left"
        ) from None
    except OSError as exc:
        raise SnapshotError(
            f"the record of sandbox {sandbox_id} cannot be read: {exc.strerror}", rule="io"
        ) from None
    try:
        doc = json.loads(raw) if len(raw) <= _MAX_RECORD else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("sandbox_id") != sandbox_id:
        raise SnapshotError(f"the record of sandbox {sandbox_id} ({path}) is corrupt", rule="checkpoint")
    if doc.get("version") != RECORD_VERSION:
        raise SnapshotError(
            f"sandbox {sandbox_id} was paused by another AgentNest version (record version "
            f"{doc.get('version')!r}, this one reads {RECORD_VERSION}); resume it with that version",
            rule="checkpoint",
        )
    return doc


def remove_record(sandbox_id: str) -> None:
    """Forget the record and its lock file (idempotent)."""
    with contextlib.suppress(ConfigurationError):
        path = _record_path(sandbox_id)
        for name in (path, path.with_suffix(".lock")):
            with contextlib.suppress(FileNotFoundError):
                name.unlink()


@contextlib.contextmanager
def resume_lock(sandbox_id: str, wait: float = 120.0) -> Iterator[None]:
    """Hold the host-wide lock of resuming sandbox ``sandbox_id`` (``flock`` on a file beside its record).

    Two processes resuming one paused sandbox at once would each attach to its
    container, and the loser's attachment, closed, would close the winner's
    agent's stdin: with the lock, the second one finds it running and gives up.
    Waits up to ``wait`` seconds (a restore takes a few).
    """
    path = _record_path(sandbox_id).with_suffix(".lock")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        until = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= until:
                    raise BackendError(
                        f"sandbox {sandbox_id} is being resumed by another process for over {wait:.0f} s"
                    ) from None
                time.sleep(0.05)  # another process holds it: poll for its release
        yield
    finally:
        os.close(fd)  # releases the lock


def recorded_owner(sandbox_id: str) -> str | None:
    """Who owns a sandbox paused to disk now (``host:pid``), if it has a readable record."""
    try:
        owner = read_record(sandbox_id).get("owner")
    except (SandboxDestroyedError, SnapshotError, ConfigurationError):
        return None
    return owner if isinstance(owner, str) else None


def config_record(config: SandboxConfig) -> dict[str, Any]:
    """``config`` as JSON data, for a record (:func:`config_from_record` reads it back)."""
    from ...secrets import Secret

    limits = config.limits
    return {
        "image": config.image,
        "lifetime": config.lifetime,
        "environment": {
            k: (
                {"secret": v.get_secret_value(), "as_file": v.as_file}
                if isinstance(v, Secret)
                else {"value": v}
            )
            for k, v in config.environment.items()
        },
        "workdir": config.workdir,
        "network": config.network.mode.value,
        "limits": {
            "memory": limits.memory,
            "cpus": limits.cpus,
            "pids": limits.pids,
            "gpus": limits.gpus,
            "workspace": limits.workspace,
            "scratch": limits.scratch,
            "workspace_medium": limits.workspace_medium,
        },
        "read_only_root": config.read_only_root,
        "user": config.user,
        "labels": dict(config.labels),
        "seccomp_profile": config.seccomp_profile,
        "apparmor_profile": config.apparmor_profile,
        "rootless": config.rootless,
    }


def config_from_record(doc: Any) -> SandboxConfig:
    """The configuration a record holds.

    Raises:
        SnapshotError: the record's configuration is not one this version can build.
    """
    from ...config import ResourceLimits, SandboxConfig
    from ...policy import NetworkPolicy
    from ...secrets import Secret

    try:
        env: dict[str, str | Secret] = {}
        for k, v in dict(doc["environment"]).items():
            env[str(k)] = (
                Secret(str(v["secret"]), as_file=bool(v["as_file"])) if "secret" in v else str(v["value"])
            )
        limits = dict(doc["limits"])
        if doc["network"] != "denied":
            raise ValueError("only network-denied sandboxes pause to disk")
        return SandboxConfig(
            image=str(doc["image"]),
            lifetime=float(doc["lifetime"]),
            environment=env,
            workdir=str(doc["workdir"]),
            network=NetworkPolicy.denied(),
            limits=ResourceLimits(**{k: limits[k] for k in limits}),
            read_only_root=bool(doc["read_only_root"]),
            user=str(doc["user"]),
            labels={str(k): str(v) for k, v in dict(doc["labels"]).items()},
            seccomp_profile=doc["seccomp_profile"],
            apparmor_profile=doc["apparmor_profile"],
            rootless=bool(doc["rootless"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError, ConfigurationError) as exc:
        raise SnapshotError(
            f"the paused sandbox's recorded configuration is unusable ({exc})", rule="checkpoint"
        ) from None
