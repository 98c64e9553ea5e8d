"""The one frame codec (agent/wire.py): round trips, incremental decoding, bounds."""

from __future__ import annotations

import json
import struct

import pytest

from agentnest.agent import wire
from agentnest.agent.wire import MAX_BODY_BYTES, MAX_HEADER_BYTES, PREFIX_SIZE, Decoder, WireError, encode
from agentnest.channel.protocol import HOST_MAX_BODY, new_decoder


def raw_frame(header: bytes, body: bytes = b"") -> bytes:
    """A frame with an arbitrary (possibly invalid) header."""
    return struct.pack(">II", len(header), len(body)) + header + body


def test_round_trip_header_and_binary_body() -> None:
    header = {"t": "out", "id": 7, "fd": 1, "text": "grüße ✓", "nested": {"a": [1, 2, None]}}
    body = bytes(range(256)) * 3
    dec = Decoder()
    dec.feed(encode(header, body))
    assert dec.frames() == [(header, body)]
    assert dec.buffered == 0


def test_empty_body_round_trip() -> None:
    dec = Decoder()
    dec.feed(encode({"t": "ping", "id": 1}))
    assert dec.frames() == [({"t": "ping", "id": 1}, b"")]


def test_prefix_is_two_big_endian_lengths() -> None:
    data = encode({"t": "x"}, b"abc")
    hlen, blen = struct.unpack(">II", data[:PREFIX_SIZE])
    assert (hlen, blen) == (len(b'{"t":"x"}'), 3)
    assert data[PREFIX_SIZE : PREFIX_SIZE + hlen] == b'{"t":"x"}'
    assert data[-3:] == b"abc"


def test_several_frames_in_one_feed() -> None:
    frames = [({"t": "out", "id": i, "fd": 1}, b"x" * i) for i in range(5)]
    dec = Decoder()
    dec.feed(b"".join(encode(h, b) for h, b in frames))
    assert dec.frames() == frames
    assert dec.buffered == 0


def test_incremental_feeding_byte_by_byte() -> None:
    frames = [({"t": "data", "id": 1}, b"hello"), ({"t": "done", "id": 1, "size": 5}, b"")]
    stream = b"".join(encode(h, b) for h, b in frames)
    ends = set()
    pos = 0
    for h, b in frames:
        pos += len(encode(h, b))
        ends.add(pos)
    dec = Decoder()
    got = []
    for i in range(len(stream)):
        dec.feed(stream[i : i + 1])
        out = dec.frames()
        if i + 1 in ends:
            assert len(out) == 1, f"a frame should complete exactly at byte {i + 1}"
        else:
            assert out == [], f"no frame may complete at byte {i + 1}"
        got.extend(out)
    assert got == frames
    assert dec.buffered == 0


def test_partial_frame_stays_buffered() -> None:
    data = encode({"t": "x", "id": 3}, b"0123456789")
    dec = Decoder()
    dec.feed(data[:-1])
    assert dec.frames() == []
    dec.feed(data[-1:])
    assert dec.frames() == [({"t": "x", "id": 3}, b"0123456789")]


def test_body_at_the_limit_is_accepted() -> None:
    dec = Decoder(max_body_bytes=100)
    dec.feed(encode({"t": "x"}, b"b" * 100))
    assert dec.frames() == [({"t": "x"}, b"b" * 100)]


def test_oversized_body_rejected_before_the_body_arrives() -> None:
    dec = Decoder(max_body_bytes=1024)
    # Only the 8-byte prefix announcing a too-large body: the decoder must not
    # wait for (and buffer) the body to refuse it.
    dec.feed(struct.pack(">II", 9, 1025))
    with pytest.raises(WireError, match="exceeds the limit"):
        dec.frames()
    assert dec.buffered <= PREFIX_SIZE


def test_oversized_header_rejected_before_the_header_arrives() -> None:
    dec = Decoder()
    dec.feed(struct.pack(">II", MAX_HEADER_BYTES + 1, 0))
    with pytest.raises(WireError, match="out of bounds"):
        dec.frames()
    assert dec.buffered <= PREFIX_SIZE


def test_huge_announced_lengths_rejected() -> None:
    dec = Decoder()
    dec.feed(struct.pack(">II", 0xFFFFFFFF, 0xFFFFFFFF))
    with pytest.raises(WireError):
        dec.frames()


def test_default_limits() -> None:
    dec = Decoder()
    dec.feed(struct.pack(">II", 9, MAX_BODY_BYTES + 1))
    with pytest.raises(WireError):
        dec.frames()


def test_host_decoder_limit() -> None:
    ok = new_decoder()
    ok.feed(struct.pack(">II", 9, HOST_MAX_BODY))
    assert ok.frames() == []  # waiting for the body, not refusing it
    bad = new_decoder()
    bad.feed(struct.pack(">II", 9, HOST_MAX_BODY + 1))
    with pytest.raises(WireError):
        bad.frames()


def test_oversized_frame_after_a_good_one() -> None:
    dec = Decoder(max_body_bytes=16)
    dec.feed(encode({"t": "a"}, b"ok"))
    assert dec.frames() == [({"t": "a"}, b"ok")]
    dec.feed(struct.pack(">II", 9, 17))
    with pytest.raises(WireError):
        dec.frames()


def test_zero_length_header_rejected() -> None:
    dec = Decoder()
    dec.feed(struct.pack(">II", 0, 0))
    with pytest.raises(WireError):
        dec.frames()


@pytest.mark.parametrize(
    "header",
    [
        pytest.param(b"not json", id="not-json"),
        pytest.param(b"{", id="truncated-json"),
        pytest.param(b"[1, 2]", id="array"),
        pytest.param(b'"hello"', id="string"),
        pytest.param(b"42", id="number"),
        pytest.param(b"null", id="null"),
        pytest.param(b"{}", id="missing-t"),
        pytest.param(b'{"id": 1}', id="missing-t-with-id"),
        pytest.param(b'{"t": 1}', id="int-t"),
        pytest.param(b'{"t": null}', id="null-t"),
        pytest.param(b'{"t": ["x"]}', id="list-t"),
        pytest.param(b'{"t": "x", "id": "1"}', id="str-id"),
        pytest.param(b'{"t": "x", "id": 1.5}', id="float-id"),
        pytest.param(b'{"t": "x", "id": 1.0}', id="integral-float-id"),
        pytest.param(b'{"t": "x", "id": true}', id="bool-id"),
        pytest.param(b'{"t": "x", "id": [1]}', id="list-id"),
        pytest.param(b"\xff\xfe{}", id="invalid-utf8"),
        pytest.param(b'{"t": "\xc3"}', id="truncated-utf8-sequence"),
        pytest.param(b'{"t": "\xed\xa0\x80"}', id="utf8-encoded-surrogate"),
        pytest.param(b"\xef\xbb\xbf" + b'{"t": "x"}', id="utf8-bom"),
    ],
)
def test_invalid_headers_rejected(header: bytes) -> None:
    dec = Decoder()
    dec.feed(raw_frame(header))
    with pytest.raises(WireError):
        dec.frames()
    with pytest.raises(WireError):
        wire.decode_header(header)


@pytest.mark.parametrize(
    "header",
    [
        {"t": "x"},
        {"t": "x", "id": None},
        {"t": "x", "id": 0},
        {"t": "x", "id": 2**40},
        {"t": "", "extra": [1, "two", {"3": 4}]},
    ],
)
def test_valid_headers_accepted(header: dict[str, object]) -> None:
    assert wire.decode_header(json.dumps(header).encode()) == header


def test_wire_error_is_not_swallowed_by_later_good_frames() -> None:
    dec = Decoder()
    dec.feed(raw_frame(b"[]") + encode({"t": "ok"}))
    with pytest.raises(WireError):
        dec.frames()


def test_a_header_nested_past_the_parsers_stack_is_a_wire_error() -> None:
    # json raises RecursionError (not a ValueError) here; uncaught it would end the
    # channel's reader thread without marking the channel broken.
    deep = b'{"t": "x", "a": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"  # 40 KB: under the bound
    with pytest.raises(WireError, match="not valid UTF-8 JSON"):
        wire.decode_header(deep)
    assert len(deep) < MAX_HEADER_BYTES
    decoder = Decoder()
    decoder.feed(raw_frame(deep))
    with pytest.raises(WireError, match="not valid UTF-8 JSON"):
        decoder.frames()
