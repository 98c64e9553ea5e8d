"""The TLS ClientHello at the start of a tunnel (egress/hello.py): sans-I/O, every field distrusted.

Pure: bytes in, a host name (or a clean HelloError) out.  Real hellos come from
this Python's ssl module through memory BIOs; nothing touches a socket.
"""

from __future__ import annotations

import contextlib
import random
import ssl

import pytest

from agentnest.egress.hello import (
    MAX_RECORD,
    RECORD_HEADER,
    ClientHelloReader,
    HelloError,
    parse_client_hello,
)
from agentnest.egress.rules import normalize_host

Result = tuple[str | None, bytes]


def _hello(sni: bytes | None, extra: bytes = b"") -> bytes:
    """A minimal ClientHello handshake body, optionally with a server_name extension."""
    exts = b""
    if sni is not None:
        entry = b"\x00" + len(sni).to_bytes(2, "big") + sni
        lst = len(entry).to_bytes(2, "big") + entry
        exts += b"\x00\x00" + len(lst).to_bytes(2, "big") + lst
    exts += extra
    head = b"\x03\x03" + b"r" * 32 + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00"
    return head + len(exts).to_bytes(2, "big") + exts


def _records(body: bytes, sizes: tuple[int, ...] = ()) -> bytes:
    """``body`` as a ClientHello handshake message in TLS records of the given fragment sizes."""
    message = b"\x01" + len(body).to_bytes(3, "big") + body
    out, pos = b"", 0
    for size in (*sizes, len(message)):
        fragment = message[pos : pos + size]
        if not fragment:
            break
        out += b"\x16\x03\x01" + len(fragment).to_bytes(2, "big") + fragment
        pos += len(fragment)
    return out


def _real_hello(server_hostname: str | None) -> bytes:
    """What this Python's TLS client sends first (TLS records holding its ClientHello)."""
    ctx = ssl.create_default_context()
    if server_hostname is None:
        ctx.check_hostname = False
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def _read(data: bytes, max_bytes: int = 64 * 1024, step: int | None = None) -> tuple[Result | None, int]:
    """Drive a reader over ``data`` as the proxy does; return (its result or None, bytes it took).

    ``step`` feeds at most that many bytes at a time (a slow client).
    """
    reader = ClientHelloReader(max_bytes)
    pos = 0
    while reader.need and pos < len(data):
        chunk = data[pos : pos + min(reader.need, step or reader.need)]
        pos += len(chunk)
        result = reader.feed(chunk)
        if result is not None:
            assert reader.need == 0
            return result, pos
    return None, pos


# -- the records -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["allowed.test", "a.b.c.example", "x" * 63 + ".test"])
def test_a_real_client_hello_names_its_server(name: str) -> None:
    data = _real_hello(name)
    assert _read(data) == ((name, data), len(data))
    assert _read(data, step=1) == ((name, data), len(data))


def test_a_real_client_hello_to_an_address_names_none() -> None:
    for target in ("127.0.0.1", None):
        data = _real_hello(target)
        assert _read(data) == ((None, data), len(data))


def test_the_reader_takes_nothing_past_the_hello() -> None:
    """What follows the hello (the client's next records) stays in the stream, for the server."""
    data = _real_hello("allowed.test")
    after = b"\x14\x03\x03\x00\x01\x01" + b"\x17\x03\x03\x00\x05early"
    assert _read(data + after) == (("allowed.test", data), len(data))


@pytest.mark.parametrize("sizes", [(1,), (3,), (4,), (1, 1, 1, 1), (10, 20), (5,) * 30])
def test_a_hello_split_over_records(sizes: tuple[int, ...]) -> None:
    data = _records(_hello(b"Allowed.Test"), sizes)
    assert _read(data) == (("allowed.test", data), len(data))
    assert _read(data, step=2) == (("allowed.test", data), len(data))


def test_an_unfinished_hello_is_no_result_yet() -> None:
    data = _records(_hello(b"allowed.test"), (7,))
    for cut in range(len(data)):
        assert _read(data[:cut]) == (None, cut)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"GET / HTTP/1.1\r\n\r\n", "not a TLS handshake record"),
        (b"SSH-2.0-OpenSSH_9.6\r\n", "not a TLS handshake record"),
        (b"\x17\x03\x03\x00\x05hello", "not a TLS handshake record"),  # application data first
        (b"\x16\x02\x00\x00\x05hello", "record version is not TLS"),
        (b"\x16\x03\x01\x00\x00", "bad TLS record length 0"),
        (b"\x16\x03\x01" + (MAX_RECORD + 1).to_bytes(2, "big"), "bad TLS record length"),
        (b"\x16\x03\x01\xff\xff", "bad TLS record length"),
        (b"\x16\x03\x01\x00\x04\x02\x00\x00\x00", "not a ClientHello"),  # a ServerHello
        (b"\x16\x03\x01\x00\x04\x01\xff\xff\xff", "larger than"),  # 16 MiB announced
        (_records(b"\x02\x00" + _hello(b"a.test")[2:]), "ClientHello version is not TLS"),
        (_records(_hello(b"bad name"), (9,)), "is not a host name"),
    ],
    ids=repr,
)
def test_what_is_no_hello_is_refused(data: bytes, message: str) -> None:
    with pytest.raises(HelloError, match=message):
        _read(data)


def test_data_after_the_hello_inside_its_records_is_refused() -> None:
    message = _records(_hello(b"a.test"))
    length = int.from_bytes(message[3:5], "big")
    padded = message[:3] + (length + 3).to_bytes(2, "big") + message[5:] + b"abc"
    with pytest.raises(HelloError, match="data after the ClientHello"):
        _read(padded)


def test_the_hello_is_bounded() -> None:
    data = _real_hello("allowed.test")
    with pytest.raises(HelloError, match="larger than 100 bytes"):
        _read(data, max_bytes=100)
    assert _read(data, max_bytes=len(data)) == (("allowed.test", data), len(data))
    with pytest.raises(HelloError, match="larger than"):
        _read(data, max_bytes=len(data) - 1)
    # Many one-byte records: the bound counts every record header too.
    tiny = _records(_hello(b"allowed.test"), (1,) * 200)
    with pytest.raises(HelloError, match="larger than"):
        _read(tiny, max_bytes=len(tiny) - 1)
    assert _read(tiny, max_bytes=len(tiny))[0] == ("allowed.test", tiny)


def test_the_reader_is_done_after_a_refusal_and_refuses_misuse() -> None:
    reader = ClientHelloReader(1024)
    assert reader.need == RECORD_HEADER
    with pytest.raises(ValueError):
        reader.feed(b"\x16\x03\x01\x00\x10x")  # more than it asked for
    assert reader.feed(b"") is None and reader.need == RECORD_HEADER
    with pytest.raises(HelloError):
        reader.feed(b"GET /")
    assert reader.need == 0
    with pytest.raises(ValueError):
        reader.feed(b"")
    done = ClientHelloReader(1024)
    data = _records(_hello(b"a.test"))
    assert _read(data) == (("a.test", data), len(data))
    for chunk in (data[:5], data[5:]):
        result = done.feed(chunk)
    assert result == ("a.test", data) and done.need == 0
    with pytest.raises(ValueError):
        done.feed(b"x")


def test_mangled_records_give_a_result_or_a_hello_error() -> None:
    rng = random.Random(32)
    good = _real_hello("allowed.test")
    for _ in range(3000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 6)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        data = data[: rng.randrange(len(data) + 1)] if rng.random() < 0.3 else data
        max_bytes = rng.choice([64 * 1024, len(good), 300])
        with contextlib.suppress(HelloError):
            result, taken = _read(bytes(data), max_bytes=max_bytes)
            assert taken <= max_bytes + RECORD_HEADER
            if result is not None:
                sni, raw = result
                assert raw == bytes(data[:taken]) and len(raw) <= max_bytes
                assert sni is None or normalize_host(sni) == sni


def test_random_bytes_give_a_hello_error_or_no_result() -> None:
    rng = random.Random(8)
    for _ in range(3000):
        data = bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
        if rng.random() < 0.5:
            data = b"\x16\x03" + data  # past the first checks
        with contextlib.suppress(HelloError):
            result, _ = _read(data, max_bytes=1024)
            assert result is None or result[0] is None or normalize_host(result[0]) == result[0]


# -- the handshake body --------------------------------------------------------------------


def test_client_hello_parser() -> None:
    assert parse_client_hello(_hello(b"Allowed.Test")) == "allowed.test"
    assert parse_client_hello(_hello(b"allowed.test.")) == "allowed.test"
    assert parse_client_hello(_hello(None)) is None
    assert parse_client_hello(_hello(None, extra=b"\x00\x0a\x00\x02\x00\x17")) is None  # no server_name
    assert parse_client_hello(_hello(None)[:-2]) is None  # no extension block at all
    for bad in (
        _hello(b"1.2.3.4"),
        _hello(b"[::1]"),
        _hello(b"bad name"),
        _hello(b"caf\xc3\xa9.test"),
        _hello(b""),
        _hello(b"a" * 64 + b".test"),
        _hello(b"a.test", extra=b"\x00\x00\x00\x00"),  # a second server_name extension
        _hello(None, extra=b"\x00\x0a\x00\x00" * 2),  # any extension twice
        _hello(b"a.test")[:-1],
        _hello(b"a.test") + b"x",
        b"\x02\x00" + _hello(b"a.test")[2:],
        b"",
        b"\x03",
        b"\x03\x03" + b"r" * 31,
    ):
        with pytest.raises(HelloError):
            parse_client_hello(bad)


def _body(session: bytes = b"", suites: bytes = b"\x13\x01", compressions: bytes = b"\x00") -> bytes:
    return (
        b"\x03\x03"
        + b"r" * 32
        + bytes([len(session)])
        + session
        + len(suites).to_bytes(2, "big")
        + suites
        + bytes([len(compressions)])
        + compressions
    )


def _sni_extension(payload: bytes) -> bytes:
    return b"\x00\x00" + len(payload).to_bytes(2, "big") + payload


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (_body(session=b"s" * 33), "session id longer than 32"),
        (_body(suites=b""), "bad cipher suite list"),
        (_body(suites=b"\x13\x01\x13"), "bad cipher suite list"),
        (_body(compressions=b""), "empty compression list"),
        (_body() + b"\x00\x05\x00\x0a\x00\x00", "extension block length"),
        (_body() + b"\x00", "truncated"),
        (_body() + b"\x00\x02\x00\x00", "truncated"),  # an extension header cut short
        (_body() + b"\x00\x04\x00\x00\x00\x05", "truncated"),  # its data cut short
        (_body() + b"\x00\x05" + _sni_extension(b"\x00"), "server_name list length"),
        (_body() + b"\x00\x06" + _sni_extension(b"\x00\x05"), "server_name list length"),
        (_body() + b"\x00\x07" + _sni_extension(b"\x00\x01\x00"), "truncated server_name entry"),
        (_body() + b"\x00\x09" + _sni_extension(b"\x00\x03\x00\x00\x05"), "truncated server name"),
        (_body() + b"\x00\x06" + _sni_extension(b"\x00\x00"), "exactly one host name"),
        (_body() + b"\x00\x0a" + _sni_extension(b"\x00\x04\x01\x00\x01a"), "exactly one host name"),
        (
            _body() + b"\x00\x0e" + _sni_extension(b"\x00\x08\x00\x00\x01a\x00\x00\x01b"),
            "exactly one host name",
        ),
        (_body() + b"\x00\x0a" + _sni_extension(b"\x00\x04\x00\x00\x01\xff"), "not ASCII"),
    ],
    ids=repr,
)
def test_garbled_bodies_say_where(body: bytes, message: str) -> None:
    with pytest.raises(HelloError, match=message):
        parse_client_hello(body)


def test_other_name_types_beside_one_host_name_are_skipped() -> None:
    entries = b"\x01\x00\x01z" + b"\x00\x00\x06a.test"
    body = (
        _body()
        + (len(entries) + 6).to_bytes(2, "big")
        + _sni_extension(len(entries).to_bytes(2, "big") + entries)
    )
    assert parse_client_hello(body) == "a.test"


def test_client_hello_parser_survives_random_bytes() -> None:
    rng = random.Random(5)
    good = _hello(b"allowed.test")
    for _ in range(3000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        with contextlib.suppress(HelloError):
            result = parse_client_hello(bytes(data))
            assert result is None or normalize_host(result) == result
