"""A private Docker engine for fault injection (tests only; needs root).

:class:`PrivateEngine` runs a second ``dockerd`` with its own data root, exec
root and socket, so that a test can stop, kill and restart an engine without
touching the one everybody else uses.  :class:`BlackholeProxy` sits in front
of its socket and can relay, refuse, or accept and never answer.

A dockerd started here outlives the test process if that dies: ``close()``
must run (a fixture finalizer), and :func:`leftovers` names whatever is left.

Example::

    with PrivateEngine() as engine, BlackholeProxy(engine.socket) as proxy:
        engine.load_image(base_image())
        backend = DockerBackend(DockerSpec(docker_host=proxy.docker_host))
        proxy.mode = "blackhole"     # new connections hang from here on
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from agentnest.testing.wait import wait_until

__all__ = ["BlackholeProxy", "PrivateEngine", "leftovers"]

NAME = "agentnest-faults"
RUNSC = "/usr/bin/runsc"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as gone.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def leftovers(name: str = NAME) -> list[str]:
    """Live processes whose command line names this engine's roots (dockerd, containerd, shims)."""
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = " ".join(a.decode(errors="replace") for a in argv if a)
        if f"/{name}" in text and _pid_alive(int(entry.name)):
            found.append(f"{entry.name} {text[:160]}")
    if _mounted(f"/var/lib/{name}"):
        found.append(f"mount /var/lib/{name}")
    bridge = _bridge_name(name)
    if subprocess.run(["ip", "link", "show", bridge], capture_output=True, check=False).returncode == 0:
        found.append(f"bridge {bridge}")
    return found


def _mounted(path: str) -> bool:
    """Whether ``path`` is a mount point (a bind mount on the same filesystem too, which
    ``os.path.ismount`` misses)."""
    try:
        with open("/proc/self/mounts") as f:
            return any(line.split()[1] == path for line in f if len(line.split()) > 1)
    except OSError:
        return False


def _bridge_name(name: str) -> str:
    """A Linux interface name (at most 15 bytes) for the bridge of engine ``name``."""
    return "agn-" + name[-11:].replace("/", "-")


class PrivateEngine:
    """A second dockerd on ``unix:///run/<name>.sock`` (runc, and runsc as on the main engine).

    Its data root persists between runs (the loaded image stays); its
    containers do not outlive :meth:`close`.
    """

    def __init__(self, name: str = NAME, *, start_timeout: float = 60.0, stop_timeout: float = 30.0) -> None:
        self.name = name
        self.data_root = Path(f"/var/lib/{name}")
        self.exec_root = Path(f"/run/{name}")
        self.pidfile = Path(f"/run/{name}.pid")
        self.socket = f"/run/{name}.sock"
        self.config_dir = Path(f"/run/{name}.d")
        self.log_path = self.config_dir / "dockerd.log"
        self.bridge = _bridge_name(name)
        #: Whether containers outlive this dockerd (read at each start).
        self.live_restore = True
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None
        self._cleaned = False
        self._api: Any = None

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket}"

    # -- process ---------------------------------------------------------------

    def _argv(self) -> list[str]:
        return [
            "dockerd",
            "--config-file",
            str(self.config_dir / "daemon.json"),
            "--data-root",
            str(self.data_root),
            "--exec-root",
            str(self.exec_root),
            "--pidfile",
            str(self.pidfile),
            "-H",
            self.docker_host,
            # Its own bridge, not "none": a dockerd without a bridge deletes
            # the default one (docker0) at start, which the host's main engine
            # and its sandboxes' networks use.
            "--bridge",
            self.bridge,
            "--iptables=false",
            "--ip-masq=false",
            "--ip6tables=false",
        ]

    def _stop_leftover(self) -> None:
        """Stop a dockerd a crashed run left behind (its pidfile), before the first start."""
        pid = _read_pid(self.pidfile)
        if pid is not None and _pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            wait_until(
                lambda: not _pid_alive(pid), f"leftover dockerd {pid} to exit", within=self.stop_timeout
            )
        self._cleaned = True

    def pid(self) -> int | None:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc.pid
        return None

    def start(self) -> None:
        if self.pid() is not None:
            return
        if not self._cleaned:
            self._stop_leftover()
        self.config_dir.mkdir(parents=True, exist_ok=True)
        self._make_bridge()
        daemon = {
            "runtimes": {"runsc": {"path": RUNSC, "runtimeArgs": ["--network=none", "--oci-seccomp"]}},
            "experimental": True,
            "live-restore": self.live_restore,
        }
        (self.config_dir / "daemon.json").write_text(json.dumps(daemon))
        if self._log is None:
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in close()
        env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"}
        self._proc = subprocess.Popen(
            self._argv(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            start_new_session=True,
            env=env,
        )
        deadline = time.monotonic() + self.start_timeout
        while not self.healthy():
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"private dockerd exited with {self._proc.returncode}; see {self.log_path}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(
                    f"private dockerd did not answer in {self.start_timeout}s; see {self.log_path}"
                )
            time.sleep(0.1)

    def _signal_and_wait(self, sig: signal.Signals) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(self.stop_timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(self.stop_timeout)

    def stop(self) -> None:
        """SIGTERM dockerd and wait for it (live-restore keeps the containers running)."""
        self._signal_and_wait(signal.SIGTERM)
        self._close_api()

    def kill(self) -> None:
        """SIGKILL dockerd (its containerd and the containers stay)."""
        self._signal_and_wait(signal.SIGKILL)
        self._close_api()

    def restart(self) -> None:
        self.stop()
        self.start()

    # -- engine API -------------------------------------------------------------

    def api(self) -> Any:
        if self._api is None:
            import docker

            self._api = docker.APIClient(base_url=self.docker_host, version="auto", timeout=30)
        return self._api

    def _close_api(self) -> None:
        if self._api is not None:
            self._api.close()
            self._api = None

    def healthy(self) -> bool:
        """Whether the engine answers ``info`` on its own socket."""
        if not os.path.exists(self.socket):
            return False
        try:
            import docker

            with docker.APIClient(base_url=self.docker_host, version="1.41", timeout=5) as client:
                client.info()
        except Exception:  # any failure is "not healthy"
            return False
        return True

    def has_image(self, image: str) -> bool:
        import docker.errors

        try:
            self.api().inspect_image(image)
        except docker.errors.ImageNotFound:
            return False
        return True

    def load_image(self, image: str, timeout: float = 180.0) -> None:
        """Copy ``image`` from the main engine into this one (``docker save | docker load``)."""
        if self.has_image(image):
            return
        env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"}
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE, env=env)
        try:
            load = subprocess.run(
                ["docker", "load", "-q"],
                stdin=save.stdout,
                capture_output=True,
                env={**env, "DOCKER_HOST": self.docker_host},
                timeout=timeout,
                check=False,
            )
        finally:
            assert save.stdout is not None
            save.stdout.close()
            save.wait(timeout)
        if save.returncode or load.returncode:
            raise RuntimeError(
                f"loading {image}: save={save.returncode} load={load.returncode} {load.stderr!r}"
            )

    def containers(self, label: str | None = None) -> list[dict[str, Any]]:
        filters = {"label": label} if label else None
        return list(self.api().containers(all=True, filters=filters))

    def remove_containers(self) -> int:
        """Force-remove every container of this engine; how many there were."""
        import docker.errors

        gone = 0
        for c in self.containers():
            with contextlib.suppress(docker.errors.NotFound):
                self.api().remove_container(c["Id"], force=True, v=True)
                gone += 1
        return gone

    def close(self) -> None:
        """Remove every container this engine ran, stop it and its containerd."""
        try:
            if self.pid() is None and not self.healthy():
                self.start()  # containers survive a stopped engine (live-restore): start it to remove them
            self.remove_containers()
        finally:
            self.stop()
            containerd = _read_pid(self.exec_root / "containerd" / "containerd.pid")
            if containerd is not None and _pid_alive(containerd):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(containerd, signal.SIGTERM)
                with contextlib.suppress(AssertionError):
                    wait_until(lambda: not _pid_alive(containerd), "private containerd to exit", within=15)
            if self._log is not None:
                self._log.close()
                self._log = None
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)
            # dockerd mounts its data root on itself (private propagation) and
            # leaves that mount behind when it stops: nothing of it may remain.
            if _mounted(str(self.data_root)):
                subprocess.run(["umount", str(self.data_root)], capture_output=True, check=False)

    def _make_bridge(self) -> None:
        """The engine's own bridge interface (routes nowhere: sandboxes on this engine are network-denied)."""
        if subprocess.run(["ip", "link", "show", self.bridge], capture_output=True).returncode == 0:
            return
        for argv in (
            ["ip", "link", "add", "name", self.bridge, "type", "bridge"],
            ["ip", "addr", "add", "169.254.213.1/30", "dev", self.bridge],
            ["ip", "link", "set", self.bridge, "up"],
        ):
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"private engine: {' '.join(argv)} failed: {done.stderr.strip()}")

    def __enter__(self) -> PrivateEngine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


Mode = Literal["relay", "refuse", "blackhole"]


class BlackholeProxy:
    """A unix socket relaying byte for byte (hijacked streams too) to ``upstream``, in a thread.

    ``mode``:

    - ``relay``: every connection is relayed to the engine;
    - ``refuse``: the socket file is gone (connecting fails: ENOENT);
    - ``blackhole``: new connections are accepted and never answered;
      connections relayed before keep going (as when the socket file is
      replaced under a running client).

    Back to ``relay``, the blackholed connections are closed (a client stuck
    on one sees it end).
    """

    def __init__(self, upstream: str, path: str | None = None) -> None:
        self.upstream = upstream
        self.path = path or f"{upstream.removesuffix('.sock')}-proxy.sock"
        self._mode: Mode = "relay"
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._held: list[socket.socket] = []
        self._relayed: set[socket.socket] = set()
        self.accepted = 0

    @property
    def docker_host(self) -> str:
        return f"unix://{self.path}"

    @property
    def mode(self) -> Mode:
        return self._mode

    @mode.setter
    def mode(self, mode: Mode) -> None:
        if mode not in ("relay", "refuse", "blackhole"):
            raise ValueError(mode)
        with self._lock:
            old, self._mode = self._mode, mode
        if mode == "refuse":
            self._unlisten()
        elif old == "refuse":
            self._listen()
        if mode == "relay":
            with self._lock:
                held, self._held = self._held, []
            for conn in held:
                self._close(conn)

    def start(self) -> None:
        self._listen()

    def _listen(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(self.path)
        os.chmod(self.path, 0o660)
        listener.listen(64)
        self._listener = listener
        self._thread = threading.Thread(
            target=self._accept, args=(listener,), name="blackhole-accept", daemon=True
        )
        self._thread.start()

    def _unlisten(self) -> None:
        listener, self._listener = self._listener, None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
            listener.close()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            self.accepted += 1
            with self._lock:
                mode = self._mode
                if mode == "blackhole":
                    self._held.append(conn)
                    continue
            try:
                up = socket.socket(socket.AF_UNIX)
                up.connect(self.upstream)
            except OSError:
                up.close()
                self._close(conn)  # the engine is down: the client sees its connection end
                continue
            with self._lock:
                self._relayed.update((conn, up))
            for src, dst in ((conn, up), (up, conn)):
                threading.Thread(
                    target=self._pump, args=(src, dst), name="blackhole-pump", daemon=True
                ).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
        except OSError:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
        finally:
            # The second pump of a pair to finish closes both.
            with self._lock:
                done = src in self._relayed and dst not in self._relayed
                self._relayed.discard(src)
            if done:
                self._close(src)
                self._close(dst)

    @staticmethod
    def _close(conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)
        conn.close()

    def close(self) -> None:
        self._unlisten()
        with self._lock:
            held, self._held = self._held, []
            relayed, self._relayed = set(self._relayed), set()
        for conn in held + list(relayed):
            self._close(conn)

    def __enter__(self) -> BlackholeProxy:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
