"""The few REST calls the backend makes, on urllib3, with every answer bounded.

Not the official client's generated API: its models changed shape between
the two majors we support (36: plain classes, 37: pydantic), it would parse
every Pod into objects we turn back into dicts, and a watch through it reads
without a bound.  Here a request is a method, a path and a JSON body; an
answer is JSON, cut at :data:`MAX_RESPONSE`; a refusal is an error of the one
tree (:func:`.reasons.api_error`); the apiserver out of reach is a
:class:`~agentnest.errors.RuntimeNotAvailableError` naming the address.  TLS,
credentials and the proxy come from the same :class:`.wsexec.KubeConnection`
the exec channel uses, built from the user's kubeconfig.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote, urlencode

from ...errors import AgentNestError, ChannelError, RuntimeNotAvailableError
from .connection import KubeConnection
from .reasons import api_error

__all__ = ["MAX_RESPONSE", "KubeRest"]

#: The largest answer read (a list of a namespace's pods fits many times over).
MAX_RESPONSE = 32 << 20
#: The longest line of a watch stream (one event: one object).
MAX_WATCH_LINE = 4 << 20
#: Field manager named on every write, so the objects say who wrote them.
FIELD_MANAGER = "agentnest"


class KubeRest:
    """A blocking JSON client of one apiserver; safe to share between threads (urllib3 pools)."""

    def __init__(self, connection: KubeConnection, *, timeout: float = 30.0) -> None:
        import urllib3

        self._connection = connection
        self._timeout = timeout
        self._urllib3 = urllib3
        pool: dict[str, Any] = {"maxsize": 8, "retries": False}
        if connection.ssl is not None:
            pool["ssl_context"] = connection.ssl
            if connection.ssl.verify_mode == ssl.CERT_NONE:
                pool["cert_reqs"] = "CERT_NONE"
            if connection.server_hostname:
                pool["server_hostname"] = connection.server_hostname
        if connection.proxy:
            self._http: Any = urllib3.ProxyManager(connection.proxy, **pool)
        else:
            self._http = urllib3.PoolManager(**pool)

    @property
    def host(self) -> str:
        return self._connection.host

    def close(self) -> None:
        self._http.clear()

    def url(self, path: str, query: Mapping[str, object] | None = None) -> str:
        q = {k: v for k, v in (query or {}).items() if v is not None}
        return self._connection.host + path + (f"?{urlencode(q, doseq=True)}" if q else "")

    def request(
        self,
        method: str,
        path: str,
        *,
        action: str,
        namespace: str | None = None,
        query: Mapping[str, object] | None = None,
        body: object = None,
        content_type: str = "application/json",
        allow_missing: bool = False,
        timeout: float | None = None,
    ) -> dict[str, Any] | None:
        """One call; the JSON answer (``None`` for a 404 when ``allow_missing``).

        ``action`` names the call in errors ("create pod agentnest-ab12").
        """
        headers = self._connection.request_headers()
        headers["Accept"] = "application/json"
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = content_type
        response = self._send(method, self.url(path, query), headers, data, timeout, stream=False)
        try:
            raw = self._read(response, MAX_RESPONSE, action)
        finally:
            response.release_conn()
        if response.status == 404 and allow_missing:
            return None
        if not 200 <= response.status < 300:
            raise api_error(response.status, raw, action=action, namespace=namespace)
        try:
            doc = json.loads(raw) if raw else {}
        except ValueError as exc:
            raise RuntimeNotAvailableError(
                f"the Kubernetes API server at {self.host} answered {action} with something that is not JSON"
            ) from exc
        if not isinstance(doc, dict):
            raise RuntimeNotAvailableError(
                f"the Kubernetes API server at {self.host} answered {action} oddly"
            )
        return doc

    def watch(
        self,
        path: str,
        *,
        action: str,
        namespace: str | None = None,
        query: Mapping[str, object] | None = None,
        timeout: float,
    ) -> Iterator[dict[str, Any]]:
        """The events of a watch (``{"type": ..., "object": ...}``), for at most ``timeout`` seconds.

        The server ends the watch at ``timeoutSeconds`` (sent, rounded up);
        the read timeout guards against a server that goes silent.
        """
        q = dict(query or {})
        q["watch"] = "true"
        q["timeoutSeconds"] = max(1, int(timeout + 0.999))
        q.setdefault("allowWatchBookmarks", "false")
        for line in self.lines(
            path, action=action, namespace=namespace, query=q, timeout=timeout + 5.0, max_line=MAX_WATCH_LINE
        ):
            if line.strip():
                yield _event(line, self.host, action)

    def lines(
        self,
        path: str,
        *,
        action: str,
        namespace: str | None = None,
        query: Mapping[str, object] | None = None,
        timeout: float,
        max_line: int,
        read_timeout: float | None = None,
        accept: str = "application/json",
    ) -> Iterator[bytes]:
        """The lines (without their newline) of a streamed answer, for at most ``timeout`` seconds.

        A watch, or a followed pod log.  ``read_timeout`` (default: all of
        ``timeout``) bounds a silence; past it the stream ends with a
        :class:`~agentnest.errors.RuntimeNotAvailableError`.  A line longer
        than ``max_line`` is refused (:class:`~agentnest.errors.ChannelError`):
        the answer is untrusted and nothing is buffered without bound.
        """
        headers = self._connection.request_headers()
        headers["Accept"] = accept
        response = self._send(
            "GET", self.url(path, query), headers, None, read_timeout or timeout, stream=True
        )
        try:
            if not 200 <= response.status < 300:
                raw = self._read(response, MAX_RESPONSE, action)
                raise api_error(response.status, raw, action=action, namespace=namespace)
            deadline = time.monotonic() + timeout
            buffer = bytearray()
            while time.monotonic() < deadline:
                try:
                    chunk = (
                        response.read1(64 << 10) if hasattr(response, "read1") else response.read(64 << 10)
                    )
                except self._urllib3.exceptions.HTTPError as exc:
                    raise self._unreachable(action, exc) from exc
                if not chunk:
                    return
                buffer += chunk
                while True:
                    end = buffer.find(b"\n")
                    if end < 0:
                        break
                    line = bytes(buffer[:end])
                    del buffer[: end + 1]
                    yield line
                if len(buffer) > max_line:
                    raise ChannelError(
                        f"a line from {self.host} ({action}) is over {max_line >> 10} KiB; refused"
                    )
        finally:
            # Close before releasing: a stream left early has unread bytes, and
            # its connection must not go back to the pool for the next call.
            response.close()
            response.release_conn()

    def _send(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        data: bytes | None,
        timeout: float | None,
        *,
        stream: bool,
    ) -> Any:
        limit = self._timeout if timeout is None else timeout
        try:
            return self._http.request(
                method,
                url,
                body=data,
                headers=headers,
                preload_content=False,
                redirect=False,
                timeout=self._urllib3.Timeout(connect=min(10.0, limit), read=limit),
            )
        except self._urllib3.exceptions.HTTPError as exc:
            raise self._unreachable(f"{method} {url.split('?', 1)[0]}", exc) from exc

    def _read(self, response: Any, limit: int, action: str) -> bytes:
        out = bytearray()
        try:
            while True:
                chunk = response.read(64 << 10)
                if not chunk:
                    return bytes(out)
                out += chunk
                if len(out) > limit:
                    raise ChannelError(
                        f"the Kubernetes API server at {self.host} answered {action} with over "
                        f"{limit >> 20} MiB; refused"
                    )
        except self._urllib3.exceptions.HTTPError as exc:
            raise self._unreachable(action, exc) from exc

    def _unreachable(self, action: str, exc: BaseException) -> AgentNestError:
        reason = getattr(exc, "reason", None)  # urllib3's MaxRetryError wraps the socket's error
        why = reason if isinstance(reason, BaseException) else exc
        return RuntimeNotAvailableError(
            f"cannot reach the Kubernetes API server at {self.host} ({action}): {why}; "
            "check the kubeconfig's server address and that the cluster is up (`kubectl cluster-info`)"
        )


def _event(line: bytes, host: str, action: str) -> dict[str, Any]:
    try:
        doc = json.loads(line)
    except ValueError as exc:
        raise ChannelError(f"a watch event from {host} ({action}) is not JSON") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("object"), dict):
        raise ChannelError(f"a watch event from {host} ({action}) has no object")
    return doc


def path(group_version: str, kind: str, namespace: str | None = None, name: str | None = None) -> str:
    """``/api/v1/namespaces/NS/pods/NAME`` and friends (``group_version`` ``v1`` is the core group)."""
    base = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    out = base + (f"/namespaces/{quote(namespace, safe='')}" if namespace is not None else "") + f"/{kind}"
    return out + (f"/{quote(name, safe='')}" if name is not None else "")
