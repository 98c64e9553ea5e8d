"""``agentnest mcp``'s browser sandboxes: the ``browser`` preset of create_sandbox and the browse tool.

Kept apart from :mod:`agentnest.mcp.service` and :mod:`agentnest.mcp.server`
(which call in here) so that they stay readable; nothing here imports the MCP
SDK at import time.

Security: a client gets a browser sandbox only when the operator allows the
preset (``ServerSettings(presets=("browser",))``).  Such a sandbox is an
ordinary sandbox of the server: the server's policy is its ceiling (memory,
CPUs, lifetime, network: with the default policy the browser reaches no site,
only files and pages served inside the sandbox), it counts against
``max_sandboxes``, and its image is the server's browser image (built once
on the engine), which is allowed for that sandbox only because the operator
enabled the preset; an image the client names must be in the policy's
``allowed_images`` as always.

.. versionadded:: 0.4.0
"""

# No ``from __future__ import annotations``: the MCP SDK reads the browse
# tool's annotations (register_browse) as objects, as in agentnest.mcp.server.

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Protocol

from ..config import PRESETS, parse_size
from ..errors import ConfigurationError, PolicyDeniedError
from ..integrations._browse import CONSOLE_SHOWN, format_browse, require_browser_sandbox

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer
    from mcp.types import CallToolResult, ToolAnnotations

    from ..policy import SecurityPolicy
    from ..runtime.base import RuntimeBackend


class PresetSettings(Protocol):
    """What a preset's sandbox needs of the server's settings (``mcp.ServerSettings``)."""

    @property
    def presets(self) -> Sequence[str]: ...

    @property
    def sandbox_kwargs(self) -> Mapping[str, Any]: ...


class BrowseService(Protocol):
    """What the browse tool needs of the server's service (``mcp.SandboxService``)."""

    def browse(
        self, sandbox_id: str, url: str, full_page: bool = False, timeout: float | None = None
    ) -> dict[str, Any]: ...


__all__ = [
    "BROWSE_INSTRUCTIONS",
    "browse",
    "check_presets",
    "preset_sandbox_kwargs",
    "register_browse",
    "tool_result",
]

#: Seconds one page action of the browse tool may take by default, and at most.
DEFAULT_BROWSE_TIMEOUT = 30.0
MAX_BROWSE_TIMEOUT = 600.0

#: Added to the server's instructions when browser sandboxes are allowed.
BROWSE_INSTRUCTIONS = """
create_sandbox with preset 'browser' makes a sandbox with Chromium: browse
opens a URL or a file of its workspace and returns the page's text, its
console messages and a screenshot."""


def check_presets(presets: object) -> tuple[str, ...]:
    """``ServerSettings.presets`` validated: a list of known preset names."""
    if isinstance(presets, str) or not isinstance(presets, (tuple, list, frozenset, set)):
        raise ConfigurationError(
            f"presets={presets!r:.80} must be a list of preset names such as ['browser']"
        )
    unknown = [p for p in presets if p not in PRESETS]
    if unknown:
        raise ConfigurationError(
            f"presets cannot allow {unknown!r:.80}; the presets are {', '.join(map(repr, PRESETS))}"
        )
    return tuple(sorted(set(presets)))


def preset_sandbox_kwargs(
    settings: PresetSettings,
    backend: "RuntimeBackend",
    policy: "SecurityPolicy",
    client: Mapping[str, Any],
    preset: object,
) -> tuple[dict[str, Any], "SecurityPolicy"]:
    """The ``Sandbox`` arguments and policy of a preset's sandbox for a client.

    ``client`` is what the client asked for (already validated).  The
    preset's defaults (memory, pids, /tmp) fill what neither the client nor
    the operator (``settings.sandbox_kwargs``) gave, the memory capped at the
    server's ceiling; without an image from the client the server's browser
    image is used (built on first use) and allowed for this sandbox only.

    Raises:
        PolicyDeniedError: the operator does not allow ``preset``.
    """
    from ..browser.image import PRESET_DEFAULTS, preset_kwargs

    if not isinstance(preset, str) or preset not in settings.presets:
        allowed = ", ".join(map(repr, settings.presets)) or "none"
        raise PolicyDeniedError(
            f"preset {str(preset)[:40]!r} is not allowed on this server (allowed: {allowed}); "
            "the operator allows presets in the server's settings"
        )
    operator = settings.sandbox_kwargs
    kwargs: dict[str, Any] = {**PRESET_DEFAULTS, **operator, **client, "preset": preset}
    if "image" not in client:
        kwargs.pop("image", None)  # the operator's image is for plain sandboxes
    if "memory" not in client and policy.max_memory is not None:
        kwargs["memory"] = min(parse_size(kwargs["memory"], "memory"), int(policy.max_memory))
    if policy.max_pids is not None and "pids" not in operator:
        kwargs["pids"] = min(int(kwargs["pids"]), policy.max_pids)
    if kwargs.get("image") is None:
        try:
            image = preset_kwargs({"preset": preset, "backend": backend})["image"]
        except ConfigurationError:
            raise ConfigurationError(
                f"this server's backend ({getattr(backend, 'name', '?')}) cannot build the browser "
                "image; the operator builds it with `agentnest image browser`, pushes it where the "
                "backend runs and allows it in the policy's allowed_images; then pass it as image"
            ) from None
        kwargs["image"] = image
        policy = dataclasses.replace(policy, allowed_images=(*policy.allowed_images, image))
    return kwargs, policy


def browse(
    entry: Any,
    url: str,
    full_page: bool,
    timeout: float | None,
    *,
    text_limit: int,
) -> dict[str, Any]:
    """Open ``url`` in the entry's browser sandbox; a JSON-ready answer with the PNG in base64.

    Keys: ``url``, ``title``, ``status``, ``text`` (the page text, bounded),
    ``console`` (the newest messages), ``screenshot`` (``path``, ``width``,
    ``height``, ``mime_type``, ``data``: base64), ``summary`` (all of it as
    one text for a model, bounded) and ``truncated``.

    Raises:
        UnsupportedCapabilityError: not a browser sandbox.
        ConfigurationError: a bad URL, ``full_page`` or ``timeout``.
        BrowserError: the page failed (timeout, navigation, refused site...).
    """
    from ..browser.driver import check_url

    require_browser_sandbox(entry.sandbox, "create_sandbox with preset 'browser'")
    if not isinstance(url, str) or len(url) > 8192:
        raise ConfigurationError("url must be a string of at most 8192 characters")
    check_url(url)
    if not isinstance(full_page, bool):
        raise ConfigurationError("full_page must be true or false")
    if timeout is None:
        limit = DEFAULT_BROWSE_TIMEOUT
    elif (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not math.isfinite(timeout)
        or not timeout > 0
    ):
        raise ConfigurationError(f"timeout={timeout!r} must be a positive number of seconds")
    elif timeout > MAX_BROWSE_TIMEOUT:
        raise ConfigurationError(f"timeout={timeout:g} is over the limit of {MAX_BROWSE_TIMEOUT:g} seconds")
    else:
        limit = float(timeout)
    with entry.lock:
        if entry.browser is None:
            entry.browser = entry.sandbox.browser()
        browser = entry.browser
    result = browser.browse(url, timeout=limit, full_page=full_page)
    summary, cut = format_browse(result, text_limit)
    text = result.text
    text_cut = len(text) > text_limit
    if text_cut:
        text = text[:text_limit]
    shot = result.screenshot
    return {
        "url": result.page.url,
        "title": result.page.title,
        "status": result.page.status,
        "text": text,
        "console": [
            {"type": m.type, "text": m.text, "url": m.url, "line": m.line}
            for m in result.console[-CONSOLE_SHOWN:]
        ],
        "screenshot": {
            "path": shot.path,
            "width": shot.width,
            "height": shot.height,
            "mime_type": "image/png",
            "data": shot.display.data,
        },
        "summary": summary,
        "truncated": cut or text_cut,
    }


def tool_result(answer: Mapping[str, Any]) -> "CallToolResult":
    """The MCP answer: the summary as text, the screenshot as an image, the rest as structure."""
    from mcp.types import CallToolResult, ImageContent, TextContent

    shot = answer["screenshot"]
    structured = {k: v for k, v in answer.items() if k not in ("summary", "screenshot")}
    structured["screenshot"] = {k: v for k, v in shot.items() if k != "data"}
    return CallToolResult(
        content=[
            TextContent(type="text", text=answer["summary"]),
            ImageContent(type="image", data=shot["data"], mime_type=shot["mime_type"]),
        ],
        structured_content=structured,
    )


def register_browse(
    server: "MCPServer",
    service: BrowseService,
    call: Callable[..., Any],
    sandbox_id_type: Any,
    annotations: "ToolAnnotations",
) -> None:
    """Add the ``browse`` tool to ``server`` (``call`` turns AgentNest errors into tool errors)."""
    from mcp.types import CallToolResult
    from pydantic import Field

    url_type = Annotated[
        str,
        Field(
            description="http:// or https:// URL (only sites the server's network policy allows), "
            "file:// URL, or absolute path of a file in the sandbox such as /workspace/index.html",
            max_length=8192,
        ),
    ]
    full_page_type = Annotated[
        bool, Field(description="screenshot the whole page, not just the 1280x720 window")
    ]
    timeout_type = Annotated[
        float | None,
        Field(
            description=f"seconds per page action (default {DEFAULT_BROWSE_TIMEOUT:g}, "
            f"at most {MAX_BROWSE_TIMEOUT:g})",
            gt=0,
        ),
    ]

    def browse(sandbox_id: str, url: str, full_page: bool = False, timeout: float | None = None) -> Any:
        """Open a page in a browser sandbox: its title, text and console, and a PNG screenshot."""
        return tool_result(call(service.browse, sandbox_id, url, full_page, timeout))

    # The SDK builds the input schema from these (the Field descriptions).
    browse.__annotations__ = {
        "sandbox_id": sandbox_id_type,
        "url": url_type,
        "full_page": full_page_type,
        "timeout": timeout_type,
        "return": CallToolResult,
    }
    server.tool(annotations=annotations)(browse)
