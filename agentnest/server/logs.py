"""Structured logs for ``agentnest serve --log-format json``: one JSON object per line.

Fields: ``ts`` (UTC, RFC 3339 with milliseconds), ``level``, ``logger``,
``message``, ``exc`` (the formatted traceback, when there is one) and any
``extra={...}`` the call passed.  Log shippers (Loki, Fluent Bit, Vector)
read it without a parsing rule.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

#: LogRecord attributes that are not ``extra`` fields.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}
#: The longest message kept (a log line must stay a line a shipper accepts).
MAX_MESSAGE = 8192


class JsonFormatter(logging.Formatter):
    """A :class:`logging.Formatter` that writes one JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message[:MAX_MESSAGE],
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)[:MAX_MESSAGE]
        return json.dumps(doc, default=str, ensure_ascii=False)


def configure(fmt: str, level: str = "info") -> dict[str, Any]:
    """Set up the ``agentnest`` and ``uvicorn`` loggers; return uvicorn's ``log_config``.

    ``fmt`` is ``text`` or ``json``.
    """
    formatter: logging.Formatter = (
        JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    handler = logging.StreamHandler()
    handler.setFormatter(formatter)
    for name in ("agentnest", "uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.propagate = False
        logger.setLevel(level.upper())
    # uvicorn keeps its own configuration unless told otherwise: ours stands.
    return {"version": 1, "disable_existing_loggers": False}


__all__ = ["JsonFormatter", "configure"]
