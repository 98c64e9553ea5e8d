"""Run the server in a background thread of this process (tests, notebooks, embedding).

Example::

    with serve_in_thread(create_app(settings)) as url:   # http://127.0.0.1:PORT
        backend = RemoteBackend(url, secret)

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import BackendError


@contextmanager
def serve_in_thread(
    app: Any, host: str = "127.0.0.1", port: int = 0, *, timeout: float = 30.0
) -> Iterator[str]:
    """Serve ``app`` with uvicorn on ``host`` (an ephemeral port by default); yield its URL.

    Leaving the block shuts the server down gracefully, which runs the app's
    lifespan end (every sandbox destroyed).
    """
    import uvicorn

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        ws_max_size=4 * 1024 * 1024,
        ws_per_message_deflate=False,
        lifespan="on",
    )
    server = uvicorn.Server(config)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            server.run()
        except BaseException as exc:  # reported to the caller below
            errors.append(exc)

    thread = threading.Thread(target=run, name="agentnest-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            thread.join(timeout)
            raise BackendError(f"the server did not start: {errors[0] if errors else 'timed out'}")
        thread.join(0.02)  # returns at once if the thread ended
    sockets = [sock for s in server.servers for sock in s.sockets]
    bound_port = sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound_port}"
    finally:
        server.should_exit = True
        thread.join(timeout)


__all__ = ["serve_in_thread"]
