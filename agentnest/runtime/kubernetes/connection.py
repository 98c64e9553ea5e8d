"""Where an exec goes and with which credentials: the apiserver's URL, TLS, token, proxy.

Built from the official client's ``Configuration`` (loaded by
:mod:`.kubeconfig`), shared by the exec websocket (:mod:`.wsexec`) and the
REST calls (:mod:`.rest`).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

from ...errors import ConfigurationError

#: Go's net/http refuses a request head over 1 MiB (MaxHeaderBytes); the argv
#: travels in the query string, so a longer URL cannot work anywhere.
MAX_URL_BYTES = 1024 * 1024 - 8 * 1024


@dataclass(frozen=True)
class KubeConnection:
    """How to reach an apiserver: URL, TLS and credentials.

    Attributes:
        host: the apiserver's base URL, ``https://HOST:PORT[/prefix]``.
        ssl: the TLS context (CA, client certificate); ``None`` for plain http.
        headers: extra request headers.
        token: called at every connect for the ``Authorization`` value, so an
            in-cluster or exec-plugin token that refreshes is picked up.
        proxy: an ``http(s)://`` or ``socks5://`` proxy, or ``None`` for a
            direct connection (environment proxies are not read: the REST
            client of the same configuration does not read them either).
        server_hostname: the TLS name to verify, when not the host's
            (kubeconfig ``tls-server-name``).
    """

    host: str
    ssl: ssl.SSLContext | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    token: Callable[[], str | None] | None = None
    proxy: str | None = None
    server_hostname: str | None = None

    def request_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.token is not None:
            value = self.token()
            if value:
                headers["Authorization"] = value
        return headers


@dataclass(frozen=True)
class ExecTarget:
    """One container to exec into."""

    connection: KubeConnection
    namespace: str
    pod: str
    container: str | None = None


def from_kube_config(configuration: Any) -> KubeConnection:
    """A :class:`KubeConnection` from a ``kubernetes.client.Configuration``.

    Load it with ``kubernetes.config.load_kube_config`` (contexts, exec
    plugins) or ``load_incluster_config`` first; this reads ``host``,
    ``ssl_ca_cert``, ``cert_file``/``key_file``, ``verify_ssl``,
    ``tls_server_name``, ``proxy`` and the bearer token (``auth_settings()``).  The
    ``kubernetes`` package itself is not imported here.

    Raises:
        ConfigurationError: no host, or a scheme other than http/https.
    """
    host = str(getattr(configuration, "host", "") or "").rstrip("/")
    parts = urlsplit(host)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(f"the Kubernetes configuration has no usable host ({host!r})")
    context: ssl.SSLContext | None = None
    if parts.scheme == "https":
        ca = getattr(configuration, "ssl_ca_cert", None)
        context = ssl.create_default_context(cafile=ca) if ca else ssl.create_default_context()
        if getattr(configuration, "verify_ssl", True) is False:
            # The kubeconfig says insecure-skip-tls-verify: honour it as the
            # REST client does (the operator chose it); the token still goes
            # only to the configured host.
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        cert = getattr(configuration, "cert_file", None)
        if cert:
            context.load_cert_chain(cert, getattr(configuration, "key_file", None) or None)
        # The apiserver would negotiate h2 otherwise, and websockets need HTTP/1.1.
        context.set_alpn_protocols(["http/1.1"])

    def token() -> str | None:
        # auth_settings() (and get_api_key_with_prefix under it) runs the
        # refresh hook first: in-cluster token rotation, exec plugins.  The
        # key is "BearerToken" from kubernetes 37 on, "authorization" before.
        settings = getattr(configuration, "auth_settings", None)
        if settings is not None:
            for entry in (settings() or {}).values():
                if (
                    isinstance(entry, dict)
                    and entry.get("in") == "header"
                    and str(entry.get("key", "")).lower() == "authorization"
                    and entry.get("value")
                ):
                    return str(entry["value"])
        getter = getattr(configuration, "get_api_key_with_prefix", None)
        value = getter("authorization") if getter is not None else None
        return str(value) if value else None

    proxy = getattr(configuration, "proxy", None) or None
    return KubeConnection(
        host=host,
        ssl=context,
        token=token,
        proxy=str(proxy) if proxy else None,
        server_hostname=getattr(configuration, "tls_server_name", None) or None,
    )


def exec_url(
    target: ExecTarget,
    argv: Sequence[str],
    *,
    stdin: bool = True,
    stdout: bool = True,
    stderr: bool = True,
) -> str:
    """The websocket URL of an exec (every argv element its own ``command=``, percent-quoted).

    Raises:
        ConfigurationError: empty argv, or a URL too long for any apiserver.
    """
    if not argv:
        raise ConfigurationError("an exec needs a command")
    parts = urlsplit(target.connection.host)
    scheme = {"https": "wss", "http": "ws"}.get(parts.scheme)
    if scheme is None:
        raise ConfigurationError(f"unsupported apiserver URL {target.connection.host!r}")
    path = (
        f"{parts.path.rstrip('/')}/api/v1/namespaces/{quote(target.namespace, safe='')}"
        f"/pods/{quote(target.pod, safe='')}/exec"
    )
    query: list[tuple[str, str]] = [("command", str(a)) for a in argv]
    if target.container:
        query.append(("container", target.container))
    flag = {True: "true", False: "false"}
    query += [("stdin", flag[stdin]), ("stdout", flag[stdout]), ("stderr", flag[stderr]), ("tty", "false")]
    url = urlunsplit((scheme, parts.netloc, path, urlencode(query, quote_via=quote, safe=""), ""))
    if len(url) > MAX_URL_BYTES:
        raise ConfigurationError(
            f"the exec URL is {len(url)} bytes (argv travels in the query string); "
            f"apiservers refuse more than ~1 MiB"
        )
    return url
