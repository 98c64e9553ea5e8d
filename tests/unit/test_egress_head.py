"""HTTP request heads as the egress proxy reads them (egress/head.py): strict, bounded, pure.

Malformed input is a RequestError with a known reason, whatever the bytes; no
other exception escapes.  The proxy's own tests (test_egress_proxy.py) send
the same kinds of heads through a socket.
"""

from __future__ import annotations

import random

import pytest

from agentnest.egress.head import (
    HOP_BY_HOP,
    Request,
    RequestError,
    body_framing,
    chunk_size,
    origin_form,
    parse_head,
    refusal,
    split_authority,
    upstream_head,
)
from agentnest.egress.rules import REASONS


def _request(target: str = "http://a.test/p", *headers: tuple[str, str], method: str = "GET") -> Request:
    return Request(method, target, 1, list(headers))


# -- request heads -------------------------------------------------------------------------


def test_a_request_head_is_parsed() -> None:
    head = b"CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\nX-Tab:\tv  \t\r\nEmpty:\r\nLatin: caf\xe9"
    request = parse_head(head, 100)
    assert (request.method, request.target, request.minor) == ("CONNECT", "a.test:443", 1)
    assert request.headers == [("Host", "a.test:443"), ("X-Tab", "v"), ("Empty", ""), ("Latin", "café")]
    assert request.values("host") == ["a.test:443"] and request.values("x-none") == []
    assert parse_head(b"GET http://a.test/ HTTP/1.0", 0).minor == 0


@pytest.mark.parametrize(
    "head",
    [
        b"",
        b"CONNECT",
        b"CONNECT\r\n",
        b"CONNECT a.test:443",
        b"connect a.test:443 HTTP/1.1",
        b"CONNECT a.test:443 HTTP/2.0",
        b"CONNECT a.test:443 HTTP/1.1 ",
        b" CONNECT a.test:443 HTTP/1.1",
        b"CONNECT  a.test:443 HTTP/1.1",
        b"CONNECT a.test:443  HTTP/1.1",
        b"CONNECT a.test:443\tHTTP/1.1",
        b"CONNECT a.test:443 http/1.1",
        b"CONNECT a.test:443 HTTP/1.1\n",  # a bare LF ending the request line
        b"CONNECT a.test:443 HTTP/1.1\nHost: b.test",
        b"CONNECT a\xff.test:443 HTTP/1.1",
        b"CONNECT a\x00.test:443 HTTP/1.1",
        b"ABCDEFGHIJKLMNOPQ a.test:443 HTTP/1.1",  # a 17-letter method
        b"GET http://a.test/" + b"x" * 8192 + b" HTTP/1.1",
        b"\x16\x03\x01\x00\x05hello",
        b"CONNECT a.test:443 HTTP/1.1\r\nBad Header",
        b"CONNECT a.test:443 HTTP/1.1\r\nNo-Colon",
        b"CONNECT a.test:443 HTTP/1.1\r\nX\n: name ending in a bare LF",
        b"CONNECT a.test:443 HTTP/1.1\r\nSpace : before",
        b"CONNECT a.test:443 HTTP/1.1\r\n: empty name",
        b"CONNECT a.test:443 HTTP/1.1\r\nX: a\r\n folded",
        b"CONNECT a.test:443 HTTP/1.1\r\nX: a\r\n\tfolded",
        b"CONNECT a.test:443 HTTP/1.1\r\nX: a\x00b",
        b"CONNECT a.test:443 HTTP/1.1\r\nX: a\nInjected: b",
        b"CONNECT a.test:443 HTTP/1.1\r\nX: a\rb",
        b"CONNECT a.test:443 HTTP/1.1\r\nX: a\x7fb",
        b"CONNECT a.test:443 HTTP/1.1\r\nN\xe4me: v",
        b"CONNECT a.test:443 HTTP/1.1\r\n\r\nX: after the end",
    ],
    ids=repr,
)
def test_malformed_heads_are_refused(head: bytes) -> None:
    with pytest.raises(RequestError) as refused:
        parse_head(head, 100)
    assert (refused.value.reason, refused.value.status) == ("bad_request", 400)


def test_too_many_headers_are_refused() -> None:
    head = b"CONNECT a.test:443 HTTP/1.1" + b"\r\nX: 1" * 101
    with pytest.raises(RequestError) as refused:
        parse_head(head, 100)
    assert (refused.value.reason, refused.value.status) == ("header_too_large", 431)
    assert len(parse_head(head, 101).headers) == 101


def test_random_heads_give_a_request_or_a_request_error() -> None:
    rng = random.Random(32)
    good = b"GET http://a.test:80/p?q HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\nX: y"
    alphabet = b"GET http:/a.:?#[]@ \t\r\n\x00\x7f\xffHTP1"
    for _ in range(5000):
        if rng.random() < 0.5:
            data = bytearray(good)
            for _ in range(rng.randint(1, 5)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            head = bytes(data)
        else:
            head = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        try:
            request = parse_head(head, 10)
        except RequestError as exc:
            assert exc.reason in REASONS
            continue
        for check in (origin_form, body_framing):
            try:
                check(request)
            except RequestError as exc:
                assert exc.reason in REASONS
        assert upstream_head(request, "/").endswith(b"Connection: close\r\n\r\n")


# -- destinations --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("authority", "default", "expected"),
    [
        ("a.test:443", None, ("a.test", 443)),
        ("a.test:1", None, ("a.test", 1)),
        ("a.test:65535", None, ("a.test", 65535)),
        ("a.test", 80, ("a.test", 80)),
        ("a.test:8080", 80, ("a.test", 8080)),
        ("1.2.3.4:443", None, ("1.2.3.4", 443)),
        ("[::1]:443", None, ("[::1]", 443)),
        ("[::1]", 80, ("[::1]", 80)),
        ("::1:443", None, ("::1", 443)),  # unbracketed: the last colon is the port's
        (":443", None, ("", 443)),  # no host: the rules refuse it as no host name
        ("a.test:0443", None, ("a.test", 443)),
    ],
)
def test_split_authority(authority: str, default: int | None, expected: tuple[str, int]) -> None:
    assert split_authority(authority, default) == expected


@pytest.mark.parametrize(
    ("authority", "reason"),
    [
        ("a.test", "bad_request"),  # CONNECT needs a port
        ("a.test:", "bad_request"),
        ("a.test:0", "bad_request"),
        ("a.test:65536", "bad_request"),
        ("a.test:99999", "bad_request"),
        ("a.test:123456", "bad_request"),
        ("a.test:-1", "bad_request"),
        ("a.test:+443", "bad_request"),
        ("a.test: 443", "bad_request"),
        ("a.test:443 ", "bad_request"),
        ("a.test:٤٤٣", "bad_request"),  # Arabic-Indic digits: int() would take them
        ("a.test:0x1bb", "bad_request"),
        ("user@a.test:443", "bad_request"),
        ("user:pass@a.test:443", "bad_request"),
        ("[::1", "bad_host"),
        ("[::1]x", "bad_host"),
        ("[::1]443", "bad_host"),
        ("[::1]:", "bad_request"),
        ("a.test:443\n", "bad_request"),
        ("[::1]:443\n", "bad_request"),
    ],
)
def test_split_authority_refuses(authority: str, reason: str) -> None:
    with pytest.raises(RequestError) as refused:
        split_authority(authority, None)
    assert refused.value.reason == reason


@pytest.mark.parametrize(
    ("target", "host_header", "expected"),
    [
        ("http://a.test/p", "a.test", ("a.test", 80, "/p")),
        ("http://a.test", "a.test", ("a.test", 80, "/")),
        ("http://a.test?q=1", "a.test", ("a.test", 80, "/?q=1")),
        ("http://a.test#frag", "a.test", ("a.test", 80, "/")),
        ("http://a.test/p?q#frag", "a.test", ("a.test", 80, "/p?q")),
        ("http://a.test:8080/p", "a.test:8080", ("a.test", 8080, "/p")),
        ("http://a.test:80/p", "a.test", ("a.test", 80, "/p")),  # the default port either way
        ("http://a.test/p", "a.test:80", ("a.test", 80, "/p")),
        ("http://A.Test./p", "a.test", ("A.Test.", 80, "/p")),  # names compare without case or final dot
        ("http://[::1]:8080/", "[::1]:8080", ("[::1]", 8080, "/")),
    ],
)
def test_origin_form(target: str, host_header: str, expected: tuple[str, int, str]) -> None:
    assert origin_form(_request(target, ("Host", host_header))) == expected


@pytest.mark.parametrize(
    ("target", "headers", "reason"),
    [
        ("http:///p", [("Host", "a.test")], "bad_request"),
        ("http://?q", [("Host", "a.test")], "bad_request"),
        ("http://u@a.test/", [("Host", "a.test")], "bad_request"),
        ("http://a.test:0/", [("Host", "a.test")], "bad_request"),
        ("http://a.test/", [], "host_mismatch"),
        ("http://a.test/", [("Host", "a.test"), ("host", "a.test")], "host_mismatch"),
        ("http://a.test/", [("Host", "b.test")], "host_mismatch"),
        ("http://a.test/", [("Host", "a.test:8080")], "host_mismatch"),
        ("http://a.test:8080/", [("Host", "a.test")], "host_mismatch"),
        ("http://a.test/", [("Host", "a.test.evil")], "host_mismatch"),
        ("http://a.test/", [("Host", "u@a.test")], "bad_request"),
        ("http://a.test/", [("Host", "a.test:x")], "bad_request"),
    ],
)
def test_origin_form_refuses(target: str, headers: list[tuple[str, str]], reason: str) -> None:
    with pytest.raises(RequestError) as refused:
        origin_form(_request(target, *headers))
    assert refused.value.reason == reason


def test_a_host_mismatch_names_the_target_for_its_event() -> None:
    with pytest.raises(RequestError) as refused:
        origin_form(_request("http://a.test:8080/", ("Host", "b.test")))
    assert (refused.value.host, refused.value.port) == ("a.test", 8080)
    assert refused.value.detail == "Host 'b.test', target 'a.test:8080'"
    with pytest.raises(RequestError) as missing:
        origin_form(_request("http://a.test/"))
    assert (missing.value.host, missing.value.port) == ("", 0)


# -- bodies ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([], 0),
        ([("Content-Length", "0")], 0),
        ([("Content-Length", "5")], 5),
        ([("content-length", "5"), ("CONTENT-LENGTH", "5")], 5),  # the same twice
        ([("Content-Length", "999999999999999")], 999999999999999),
        ([("Transfer-Encoding", "chunked")], "chunked"),
        ([("Transfer-Encoding", " Chunked ")], "chunked"),
    ],
)
def test_body_framing(headers: list[tuple[str, str]], expected: int | str) -> None:
    assert body_framing(_request("http://a.test/", *headers)) == expected


@pytest.mark.parametrize(
    "headers",
    [
        [("Content-Length", "5"), ("Transfer-Encoding", "chunked")],
        [("Transfer-Encoding", "gzip, chunked")],
        [("Transfer-Encoding", "chunked"), ("Transfer-Encoding", "chunked")],
        [("Transfer-Encoding", "identity")],
        [("Content-Length", "5"), ("Content-Length", "6")],
        [("Content-Length", "-1")],
        [("Content-Length", "+5")],
        [("Content-Length", "5, 5")],
        [("Content-Length", "0x5")],
        [("Content-Length", "")],
        [("Content-Length", "1000000000000000")],  # 16 digits
        [("Content-Length", "\xb2")],  # '²': a digit to str.isdigit, not to HTTP (nor to int())
        [("Content-Length", "5\n")],
    ],
)
def test_ambiguous_framing_is_refused(headers: list[tuple[str, str]]) -> None:
    with pytest.raises(RequestError) as refused:
        body_framing(_request("http://a.test/", *headers))
    assert refused.value.reason == "bad_request"


@pytest.mark.parametrize(
    ("line", "size"),
    [
        (b"0", 0),
        (b"5", 5),
        (b"1a", 26),
        (b"FF", 255),
        (b"a;ext=1", 10),
        (b"a;\t x", 10),
        (b"f" * 16, 2**64 - 1),
    ],
)
def test_chunk_size(line: bytes, size: int) -> None:
    assert chunk_size(line) == size


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"g",
        b" 5",
        b"5 ",
        b"-5",
        b"0x5",
        b"f" * 17,
        b"5;\x00",
        b"5;\x7f",
        b"5\r",
        b"5\n",  # a bare LF: the server could read the chunk's data from another byte
        b"5;a\n",
        b"\xff",
    ],
)
def test_malformed_chunk_sizes_are_refused(line: bytes) -> None:
    with pytest.raises(RequestError) as refused:
        chunk_size(line)
    assert refused.value.reason == "bad_request"


# -- what goes out ---------------------------------------------------------------------------


def test_upstream_head_drops_hop_by_hop_headers_and_closes() -> None:
    headers = [("Host", "a.test"), ("X-A", "1")] + [(name.title(), "x") for name in sorted(HOP_BY_HOP)]
    headers += [("Accept", "caf\xe9")]
    head = upstream_head(_request("http://a.test/p", *headers, method="POST"), "/p")
    assert head == (
        b"POST /p HTTP/1.1\r\nHost: a.test\r\nX-A: 1\r\nAccept: caf\xe9\r\nConnection: close\r\n\r\n"
    )


@pytest.mark.parametrize(
    ("status", "phrase"),
    [
        (400, b"Bad Request"),
        (403, b"Forbidden"),
        (431, b"Request Header Fields Too Large"),
        (418, b"Refused"),
    ],
)
def test_refusal(status: int, phrase: bytes) -> None:
    reply = refusal(RequestError("domain_not_allowed", "b.test is not on the allowlist \u2603", status))
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 %d %s" % (status, phrase)
    assert b"X-AgentNest-Egress: denied; reason=domain_not_allowed" in lines
    assert b"Connection: close" in lines
    assert b"Content-Length: %d" % len(body) in lines
    assert body.decode("utf-8") == (
        "agentnest egress proxy refused this connection: "
        "domain_not_allowed (b.test is not on the allowlist \u2603)\n"
    )
