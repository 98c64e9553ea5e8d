"""The messages of E2B's envd services as they travel: Connect-RPC with the protobuf-JSON codec.

Written from the documented wire format (docs/e2b.md, ../shared/research/e2b-compat.md):
field names in lowerCamelCase, 64-bit integers as strings, ``bytes`` as
base64, enums by name, defaults omitted.  Field numbers never travel in
JSON, so no ``.proto`` file is needed; the SDK reads unknown fields
leniently and so do we (``extra="ignore"``).  Every string and list a
client sends is bounded here, before any handler sees it.

:class:`JSONCodec` plugs these models into ``connectrpc``'s server
(codec name ``json``, used for ``application/json`` and
``application/connect+json``); :func:`method` declares an RPC.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, TypeVar

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.method import IdempotencyLevel, MethodInfo, StreamType
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, ValidationError
from pydantic.alias_generators import to_camel

#: Longest path, command or argument a client may send (bytes of text).
MAX_TEXT = 128 * 1024
#: Most arguments or environment variables in one command.
MAX_ITEMS = 4096
#: Largest piece of input (stdin) in one message.
MAX_INPUT = 4 * 1024 * 1024


def _b64(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if not isinstance(value, str):
        raise ValueError("must be base64 text")
    if len(value) > MAX_INPUT * 4 // 3 + 4:
        raise ValueError(f"longer than {MAX_INPUT} bytes")
    try:
        # protobuf-JSON accepts both alphabets, padded or not.
        text = value.replace("-", "+").replace("_", "/")
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("is not valid base64") from None


#: ``bytes`` on the wire: base64 both ways.
B64 = Annotated[
    bytes,
    BeforeValidator(_b64),
    PlainSerializer(lambda b: base64.b64encode(b).decode("ascii"), return_type=str),
]
#: ``int64``/``uint64`` on the wire: a decimal string out (numbers accepted in).
Int64 = Annotated[int, PlainSerializer(lambda n: str(n), return_type=str)]
Text = Annotated[str, Field(max_length=MAX_TEXT)]


class Msg(BaseModel):
    """A protobuf-JSON message: camelCase names, unknown fields ignored, None left out."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=False)


M = TypeVar("M", bound=Msg)


class JSONCodec:
    """``connectrpc`` codec ``json`` over :class:`Msg` models."""

    def name(self) -> str:
        return "json"

    def encode(self, message: Msg) -> bytes:
        return message.model_dump_json(by_alias=True, exclude_none=True).encode("utf-8")

    def decode(self, data: bytes | bytearray, message_class: type[M]) -> M:
        try:
            return message_class.model_validate_json(bytes(data) or b"{}")
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "the message"
            raise ConnectError(
                Code.INVALID_ARGUMENT,
                f"malformed {message_class.__name__}: {where}: {first.get('msg', 'invalid')}",
            ) from None


def method(
    service: str, name: str, request: type[Msg], response: type[Msg], kind: StreamType = StreamType.UNARY
) -> MethodInfo[Any, Any]:
    return MethodInfo(
        name=name,
        service_name=service,
        input=request,
        output=response,
        idempotency_level=IdempotencyLevel.UNKNOWN,
        stream_type=kind,
    )


class Empty(Msg):
    pass


# -- process.Process ------------------------------------------------------------------


class ProcessConfig(Msg):
    cmd: Text
    args: list[Text] = Field(default_factory=list, max_length=MAX_ITEMS)
    envs: dict[Annotated[str, Field(max_length=1024)], Text] = Field(
        default_factory=dict, max_length=MAX_ITEMS
    )
    cwd: Text | None = None


class PtySize(Msg):
    cols: int = Field(default=80, ge=0, le=10000)
    rows: int = Field(default=24, ge=0, le=10000)


class Pty(Msg):
    size: PtySize | None = None


class ProcessSelector(Msg):
    pid: int | None = Field(default=None, ge=0, le=2**32 - 1)
    tag: Annotated[str, Field(max_length=256)] | None = None


class ProcessInput(Msg):
    stdin: B64 | None = None
    pty: B64 | None = None


class StartRequest(Msg):
    process: ProcessConfig
    pty: Pty | None = None
    tag: Annotated[str, Field(max_length=256)] | None = None
    stdin: bool | None = None


class StartEvent(Msg):
    pid: int


class DataEvent(Msg):
    stdout: B64 | None = None
    stderr: B64 | None = None
    pty: B64 | None = None


class EndEvent(Msg):
    exit_code: int | None = None
    exited: bool | None = None
    status: str | None = None
    error: str | None = None


class ProcessEvent(Msg):
    start: StartEvent | None = None
    data: DataEvent | None = None
    end: EndEvent | None = None
    keepalive: Empty | None = None


class EventResponse(Msg):
    """``StartResponse`` and ``ConnectResponse``: one process event."""

    event: ProcessEvent


class ConnectRequest(Msg):
    process: ProcessSelector


class ProcessInfo(Msg):
    config: ProcessConfig
    pid: int
    tag: str | None = None


class ListResponse(Msg):
    processes: list[ProcessInfo] = Field(default_factory=list)


class SendInputRequest(Msg):
    process: ProcessSelector
    input: ProcessInput


class StreamInputStart(Msg):
    process: ProcessSelector


class StreamInputData(Msg):
    input: ProcessInput


class StreamInputRequest(Msg):
    start: StreamInputStart | None = None
    data: StreamInputData | None = None
    keepalive: Empty | None = None


class SendSignalRequest(Msg):
    process: ProcessSelector
    signal: Annotated[str | int, Field()] = "SIGNAL_UNSPECIFIED"


class SelectorRequest(Msg):
    """``CloseStdinRequest``: just the process."""

    process: ProcessSelector


class UpdateRequest(Msg):
    process: ProcessSelector
    pty: Pty | None = None


PROCESS = "process.Process"

# -- filesystem.Filesystem ---------------------------------------------------------------


class PathRequest(Msg):
    """``StatRequest``, ``MakeDirRequest``, ``RemoveRequest``."""

    path: Text


class ListDirRequest(Msg):
    path: Text
    depth: int = Field(default=0, ge=0, le=64)


class MoveRequest(Msg):
    source: Text
    destination: Text


class EntryInfo(Msg):
    name: str
    type: str
    path: str
    size: Int64 = 0
    mode: int = 0
    permissions: str = ""
    owner: str = ""
    group: str = ""
    modified_time: str | None = None
    symlink_target: str | None = None


class EntryResponse(Msg):
    """``StatResponse``, ``MakeDirResponse``, ``MoveResponse``."""

    entry: EntryInfo


class ListDirResponse(Msg):
    entries: list[EntryInfo] = Field(default_factory=list)


class WatchRequest(Msg):
    """``WatchDirRequest`` and ``CreateWatcherRequest``."""

    path: Text
    recursive: bool = False
    include_entry: bool = False
    allow_network_mounts: bool = False


class FilesystemEvent(Msg):
    name: str
    type: str


class WatchDirResponse(Msg):
    start: Empty | None = None
    filesystem: FilesystemEvent | None = None
    keepalive: Empty | None = None


class WatcherId(Msg):
    """``CreateWatcherResponse``, ``GetWatcherEventsRequest``, ``RemoveWatcherRequest``."""

    watcher_id: Annotated[str, Field(max_length=64)]


class WatcherEvents(Msg):
    events: list[FilesystemEvent] = Field(default_factory=list)


FILESYSTEM = "filesystem.Filesystem"
