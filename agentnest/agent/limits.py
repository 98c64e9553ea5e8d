"""What the host, the agent and a session's interpreter agree on: limits, names and display types.

The host imports this module (``channel/protocol.py`` checks every frame of
a session against these limits, ``session.py`` refuses oversized code and
bad names before sending); the agent's session supervisor
(:mod:`.sessions`) and the interpreter child (:mod:`.repl`) enforce the
same numbers on their side, so no side trusts another to have done it.

Stdlib-only and imports nothing: it ships to the sandbox with the agent,
and to every interpreter child.
"""

from __future__ import annotations

from typing import Any

#: Largest repr of a trailing expression that comes back, in characters.
RESULT_LIMIT = 64 * 1024
#: Largest traceback that comes back, in characters (head and tail are kept).
ERROR_LIMIT = 64 * 1024
#: Largest ``value`` frame body: the limits above in UTF-8, plus room for a marker.
VALUE_MAX_BYTES = 4 * max(RESULT_LIMIT, ERROR_LIMIT) + 1024
#: Largest single display item (an image, an HTML table...).
DISPLAY_ITEM_LIMIT = 16 * 1024 * 1024
#: Display items per run; more are dropped (``truncated``).
MAX_DISPLAY_ITEMS = 256
#: Largest piece of code one run accepts (the host refuses more before sending).
MAX_CODE_BYTES = 8 * 1024 * 1024
#: After the interrupt at a deadline, how long code may take to stop before
#: the interpreter is killed (its state is then lost).
INTERRUPT_GRACE = 2.0
#: Sessions per agent.  Each costs four of the agent's descriptors and a
#: Python process; the cap keeps a runaway caller from exhausting either.
MAX_SESSIONS = 64
#: A session name: 1 to 64 of these characters, not starting with ``.`` or ``-``.
#: Names are how a host finds a session again (a new channel to the same
#: agent, or a live-forked child), so they are plain, printable and short.
NAME_MAX = 64
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
#: A session key: the host's id for the session (lowercase hex), kept here so
#: that every host that lists or attaches to it reports the same id.
KEY_MAX = 32
KEY_CHARS = frozenset("0123456789abcdef")
#: Display MIME types, richest first: the first one an object offers wins.
RICH_METHODS = (
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
)
DISPLAY_MIMES = frozenset([m for _, m in RICH_METHODS] + ["text/plain"])
BINARY_MIMES = frozenset(["image/png", "image/jpeg"])
CHILD_PACKAGE = "agentnest_session"
#: How the interpreter's own frames are named in tracebacks (they are hidden).
OWN_FILES = "<%s/" % CHILD_PACKAGE


def valid_name(value: Any) -> bool:
    """Whether ``value`` is a session name (:data:`NAME_MAX`, :data:`NAME_CHARS`)."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= NAME_MAX
        and value[0] not in ".-"
        and all(c in NAME_CHARS for c in value)
    )


def valid_key(value: Any) -> bool:
    """Whether ``value`` is a session key (:data:`KEY_MAX`, :data:`KEY_CHARS`)."""
    return isinstance(value, str) and 0 < len(value) <= KEY_MAX and all(c in KEY_CHARS for c in value)
