"""The input rules every surface of ``agentnest serve`` shares: names, directories, numbers, media types.

One function per rule, used by the native API, the admin API and every part
of the E2B face (control plane, envd's Connect RPCs, ``/files``,
``/execute``, ``/contexts``), so that a value one surface refuses is refused
by all of them, for the same reason, in the same words.  Each check raises
:class:`~agentnest.errors.ConfigurationError` (or returns the reason); the
surface answers it in its own shape (``{"detail", "code"}``, E2B's
``{"code", "message"}``, a Connect error).  Pure: no I/O, no framework.

.. versionadded:: 0.4.0
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Mapping
from typing import Any

from ..config import env_name_problem
from ..errors import ConfigurationError

#: Longest environment value (the kernel's limit on one ``execve`` string is 128 KiB).
MAX_ENV_VALUE = 128 * 1024
#: Longest metadata key and value of an E2B sandbox.
MAX_METADATA_KEY = 256
MAX_METADATA_VALUE = 4096
#: The latest Unix time a query may name (2286-11-20): later is a typo, not a window.
MAX_UNIX_TIME = 1e10
#: The media types of a JSON body (``application/json``, ``application/problem+json``...).
_JSON_SUFFIX = "+json"


def check_env(env: Mapping[Any, Any], where: str = "environment") -> None:
    """Every name by :func:`~agentnest.config.env_name_problem`; values strings without NUL."""
    for name, value in env.items():
        problem = env_name_problem(name)
        if problem is not None:
            raise ConfigurationError(f"{where}: {problem}")
        if not isinstance(value, str) or "\x00" in value or len(value) > MAX_ENV_VALUE:
            raise ConfigurationError(
                f"{where}[{name!r}] must be a string of at most {MAX_ENV_VALUE} characters without NUL"
            )


def metadata_key_problem(key: object) -> str | None:
    """Why ``key`` cannot be a metadata key (None: it can).

    Printable ASCII without ``=`` and ``&``, 1 to :data:`MAX_METADATA_KEY`
    characters: a key travels in the list filter's query string
    (``metadata=k%3Dv%26...``), the audit log and log lines, where a NUL, a
    control character or a separator would cut it or make it match another.
    """
    if (
        not isinstance(key, str)
        or not 0 < len(key) <= MAX_METADATA_KEY
        or not all(0x20 < ord(c) < 0x7F for c in key)
        or "=" in key
        or "&" in key
    ):
        return (
            f"metadata key {str(key)[: MAX_METADATA_KEY + 8]!r} is invalid; use 1 to {MAX_METADATA_KEY} "
            "printable ASCII characters other than space, '=' and '&'"
        )
    return None


def check_metadata(metadata: Mapping[Any, Any]) -> None:
    for key, value in metadata.items():
        problem = metadata_key_problem(key)
        if problem is not None:
            raise ConfigurationError(problem)
        if not isinstance(value, str) or "\x00" in value or len(value) > MAX_METADATA_VALUE:
            raise ConfigurationError(
                f"metadata[{key!r}] must be a string of at most {MAX_METADATA_VALUE} characters without NUL"
            )


def confine(root: str, path: str, shown: str | None = None) -> str:
    """``path`` resolved lexically against the workspace ``root``, which it must not leave.

    Relative paths are below ``root``; ``..`` is resolved without looking
    at the disk (a link is the guard's business, which follows none), and
    the result must be ``root`` or below it.  The working directory of a
    command or a code context is confined so, as docs/e2b.md promises: it
    is the workspace, never the image's ``/``.  ``shown`` is the path as the
    client gave it, for the message (when ``path`` is already mapped).
    """
    if not isinstance(path, str) or "\x00" in path:
        raise ConfigurationError("the working directory must be a path without NUL bytes")
    root = posixpath.normpath(root) if root not in ("", "/") else "/"
    full = posixpath.normpath(path if path.startswith("/") else posixpath.join(root, path))
    if full.startswith("//"):
        full = full[1:]
    if root != "/" and full != root and not full.startswith(root + "/"):
        given = path if shown is None else shown
        raise ConfigurationError(
            f"the working directory {given[:200]!r} is outside the workspace {root}; "
            "use a path inside it (relative paths are relative to it)"
        )
    return full


def finite(value: object, name: str, low: float, high: float) -> float:
    """A finite number in ``[low, high]`` (booleans, NaN and infinities refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"{name} must be a number from {low:g} to {high:g}")
    number = float(value)
    if not math.isfinite(number) or not low <= number <= high:
        raise ConfigurationError(f"{name}={value!r} is out of range: give a number from {low:g} to {high:g}")
    return number


def media_type(header: str | None) -> str:
    """The media type of a ``Content-Type`` header, lower case, without its parameters ('' if none)."""
    return (header or "").split(";", 1)[0].strip().lower()


def is_json(header: str | None, *, empty: bool = True) -> bool:
    """Whether a ``Content-Type`` says JSON (an absent one counts when ``empty``)."""
    kind = media_type(header)
    if not kind:
        return empty
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith(_JSON_SUFFIX))


def json_safe(value: Any) -> Any:
    """``value`` with non-finite floats as text: JSON has no NaN, and a refusal quoting one must render."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


__all__ = [
    "MAX_ENV_VALUE",
    "MAX_METADATA_KEY",
    "MAX_UNIX_TIME",
    "check_env",
    "check_metadata",
    "confine",
    "finite",
    "is_json",
    "json_safe",
    "media_type",
    "metadata_key_problem",
]
