"""Secret values and their redaction (secrets.py), including across stream chunks."""

from __future__ import annotations

import base64
import copy
import pickle
import random
import re
import urllib.parse
from typing import Any

import pytest

from agentnest.config import SandboxConfig
from agentnest.errors import AgentNestError, ConfigurationError
from agentnest.secrets import REDACTED, SECRET_DIR, Secret, StreamRedactor, expand, redact, secret_forms

VALUE = "s3cr3t-t0ken-XYZ"


def stream(redactor: StreamRedactor, chunks: list[str]) -> str:
    return "".join(redactor.feed(c) for c in chunks) + redactor.flush()


# -- Secret ----------------------------------------------------------------------


def test_secret_repr_and_str_hide_the_value() -> None:
    s = Secret(VALUE)
    for text in (repr(s), str(s), f"{s}", f"{s!r}", f"{s!s}", repr([s]), repr({"k": s}), format(s, "")):
        assert VALUE not in text
        assert "*" in text


def test_secret_gives_its_value_on_request() -> None:
    assert Secret(VALUE).get_secret_value() == VALUE


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_secret_is_not_picklable(protocol: int) -> None:
    with pytest.raises(TypeError):
        pickle.dumps(Secret(VALUE), protocol=protocol)


def test_secret_is_not_picklable_inside_a_container() -> None:
    with pytest.raises(TypeError):
        pickle.dumps({"env": [Secret(VALUE)]})


def test_secret_cannot_be_copied_through_reduce() -> None:
    with pytest.raises(TypeError):
        copy.deepcopy(Secret(VALUE))


def test_secret_has_no_dict_to_leak() -> None:
    assert not hasattr(Secret(VALUE), "__dict__")


@pytest.mark.parametrize("value", [None, 5, b"bytes"], ids=repr)
def test_secret_needs_a_str(value: object) -> None:
    with pytest.raises(ConfigurationError):
        Secret(value)  # type: ignore[arg-type]


def test_secret_equality_and_hash() -> None:
    assert Secret("a") == Secret("a")
    assert Secret("a") != Secret("b")
    assert Secret("a") != "a"
    assert hash(Secret("a")) == hash(Secret("a"))
    assert len({Secret("a"), Secret("a"), Secret("b")}) == 2


# -- redact ----------------------------------------------------------------------


def test_redact_every_occurrence() -> None:
    assert redact(f"a {VALUE} b {VALUE}", (VALUE,)) == f"a {REDACTED} b {REDACTED}"


def test_redact_several_secrets() -> None:
    assert redact("user=alice pass=hunter2", ("alice", "hunter2")) == f"user={REDACTED} pass={REDACTED}"


def test_redact_longest_secret_first() -> None:
    # If the short one went first, "def" of the long secret would be left behind.
    assert redact("xx abcdef yy", ("abc", "abcdef")) == f"xx {REDACTED} yy"


def test_redact_without_secrets_or_matches() -> None:
    assert redact("plain text", ()) == "plain text"
    assert redact("plain text", ("absent",)) == "plain text"


def test_redact_ignores_empty_secret() -> None:
    assert redact("abc", ("",)) == "abc"


# -- StreamRedactor ----------------------------------------------------------------


def test_stream_no_secrets_is_passthrough() -> None:
    r = StreamRedactor(())
    # Nothing is held back, not even text that looks like a prefix of anything.
    assert r.feed("s3cr") == "s3cr"
    assert r.feed("") == ""
    assert r.flush() == ""


def test_stream_without_matches_releases_text_not_a_secret_prefix() -> None:
    r = StreamRedactor((VALUE,))
    assert r.feed("hello world\n") == "hello world\n"
    assert r.flush() == ""


def test_stream_whole_secret_in_one_chunk() -> None:
    r = StreamRedactor((VALUE,))
    assert r.feed(f"token={VALUE}!") == f"token={REDACTED}!"


def test_stream_secret_split_across_two_chunks() -> None:
    r = StreamRedactor((VALUE,))
    first = r.feed(f"token={VALUE[:5]}")
    assert VALUE[:5] not in first  # the possible start of the secret is held back
    assert first == "token="
    rest = r.feed(f"{VALUE[5:]} end")
    assert first + rest + r.flush() == f"token={REDACTED} end"


def test_stream_secret_split_across_three_chunks() -> None:
    chunks = ["a ", VALUE[:4], VALUE[4:10], VALUE[10:] + " z"]
    out = StreamRedactor((VALUE,))
    released = [out.feed(c) for c in chunks]
    joined = "".join(released) + out.flush()
    assert joined == f"a {REDACTED} z"
    for piece in released:
        assert VALUE[:4] not in piece


def test_stream_secret_one_character_per_chunk() -> None:
    text = f"<{VALUE}>"
    r = StreamRedactor((VALUE,))
    released = [r.feed(ch) for ch in text]
    assert "".join(released) + r.flush() == f"<{REDACTED}>"
    # No released piece, or run of pieces, ever contains two consecutive secret chars.
    assert VALUE[:2] not in "".join(released)


def test_stream_secret_ending_exactly_at_chunk_boundary() -> None:
    r = StreamRedactor((VALUE,))
    assert r.feed(f"x{VALUE}") == f"x{REDACTED}"
    assert r.feed("y") == "y"
    assert r.flush() == ""


def test_stream_secret_starting_exactly_at_chunk_boundary() -> None:
    r = StreamRedactor((VALUE,))
    assert stream(r, ["before ", VALUE, " after"]) == f"before {REDACTED} after"


def test_stream_flush_releases_held_text() -> None:
    r = StreamRedactor((VALUE,))
    assert r.feed("tail " + VALUE[:6]) == "tail "
    assert r.flush() == VALUE[:6]  # it never became the secret: hand it over
    assert r.flush() == ""


def test_stream_holds_back_less_than_a_secret() -> None:
    r = StreamRedactor((VALUE,))
    out = r.feed("x" * 1000 + VALUE[:-1])
    assert out == "x" * 1000
    assert len(r.flush()) == len(VALUE) - 1


def test_stream_multiple_secrets() -> None:
    r = StreamRedactor(("alice", "hunter2"))
    got = stream(r, ["user=al", "ice pass=hun", "ter2 ok"])
    assert got == f"user={REDACTED} pass={REDACTED} ok"


def test_stream_overlapping_secrets_split_inside_the_short_one() -> None:
    r = StreamRedactor(("abc", "abcdef"))
    assert stream(r, ["xxab", "cdefyy"]) == f"xx{REDACTED}yy"


def test_stream_overlapping_secrets_short_one_alone() -> None:
    r = StreamRedactor(("abc", "abcdef"))
    assert stream(r, ["xxab", "c yy"]) == f"xx{REDACTED} yy"


def test_stream_overlapping_secrets_split_right_after_the_short_one() -> None:
    r = StreamRedactor(("abc", "abcdef"))
    got = stream(r, ["xxabc", "defyy"])
    assert "def" not in got
    assert got == redact("xxabcdefyy", ("abc", "abcdef")) == f"xx{REDACTED}yy"


def test_stream_short_secret_at_the_end_of_the_stream() -> None:
    # Held back in case the longer secret follows; the stream ends instead.
    r = StreamRedactor(("abc", "abcdef"))
    assert stream(r, ["xxabc"]) == f"xx{REDACTED}"
    r = StreamRedactor(("abc", "abcdef"))
    assert stream(r, ["xxab", "c"]) == f"xx{REDACTED}"


def test_stream_matches_one_shot_redaction_with_overlapping_secrets() -> None:
    secrets = ("abc", "abcdef", "cdx", "bcd")
    rng = random.Random(7)
    for _ in range(3000):
        text = "".join(rng.choice("abcdefx") for _ in range(rng.randint(0, 30)))
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(0, 6))))
        chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert stream(StreamRedactor(secrets), chunks) == redact(text, secrets), (text, chunks)


def test_stream_matches_one_shot_redaction_for_any_chunking() -> None:
    secrets = ("hunter2", "TOKEN-9f8e7d", "pw")
    rng = random.Random(20240531)
    for _ in range(300):
        parts = []
        for _ in range(rng.randint(0, 12)):
            parts.append("".join(rng.choice("abxyz \n") for _ in range(rng.randint(0, 6))))
            parts.append(rng.choice(secrets))
        text = "".join(parts)
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(0, 8))))
        chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        got = stream(StreamRedactor(secrets), chunks)
        assert got == redact(text, secrets), (text, chunks)
        for s in secrets:
            assert s not in got


def test_errors_are_agentnest_errors() -> None:
    with pytest.raises(AgentNestError):
        Secret(b"bytes")  # type: ignore[arg-type]


def test_an_empty_secret_is_accepted_and_redacts_nothing() -> None:
    """0.3.0 took ``Secret("")``; there is nothing to redact, and nothing else is touched."""
    assert Secret("").value == ""
    assert redact("text stays", expand(("",))) == "text stays"


# -- encoded forms (docs/secrets.md promises exactly these) ------------------------------


TOKEN = "sk-live_4f9a+b/c=Zq"  # has characters that base64 and percent-encoding change


def hidden(text: str, value: str = TOKEN) -> str:
    return redact(text, expand((value,)))


@pytest.mark.parametrize("encode", [base64.b64encode, base64.urlsafe_b64encode], ids=["std", "urlsafe"])
def test_base64_of_the_value_is_redacted(encode: Any) -> None:
    whole = encode(TOKEN.encode()).decode()
    out = hidden(f"token={whole}!")
    assert whole not in out and whole.rstrip("=") not in out
    assert out == f"token={REDACTED}!"


@pytest.mark.parametrize("prefix", ["", "u", "us", "user:", "a-longer-user:"])
@pytest.mark.parametrize("suffix", ["", "x", "xy", ":more"])
def test_base64_of_a_text_containing_the_value_is_redacted_at_every_alignment(
    prefix: str, suffix: str
) -> None:
    encoded = base64.b64encode(f"{prefix}{TOKEN}{suffix}".encode()).decode()
    out = hidden("Authorization: Basic " + encoded)
    assert out.count(REDACTED) == 1
    # Only the characters that also depend on the bytes around the secret remain
    # (at most 3 on each side), never enough to rebuild it.
    leftover = out.split()[-1].replace(REDACTED, "")
    around = len(base64.b64encode(prefix.encode())) + len(base64.b64encode(suffix.encode()))
    assert len(leftover) <= around + 6


def test_percent_encoded_forms_are_redacted() -> None:
    for form in (
        urllib.parse.quote(TOKEN, safe=""),
        urllib.parse.quote_plus(TOKEN, safe=""),
        re.sub("%[0-9A-F]{2}", lambda m: m.group(0).lower(), urllib.parse.quote(TOKEN, safe="")),
    ):
        assert form != TOKEN
        assert hidden(f"GET /?key={form}&x=1") == f"GET /?key={REDACTED}&x=1"


def test_hex_forms_are_redacted() -> None:
    raw = TOKEN.encode()
    assert hidden(raw.hex()) == REDACTED
    assert hidden(raw.hex().upper()) == REDACTED


def test_short_secrets_only_match_whole_encodings() -> None:
    # A 3-byte secret has no base64 core long enough to match safely inside other text.
    forms = secret_forms("abc")
    assert "abc" in forms and base64.b64encode(b"abc").decode() in forms
    assert all(len(f) >= 3 for f in forms)
    assert hidden(base64.b64encode(b"xxabcxx").decode(), "abc") == base64.b64encode(b"xxabcxx").decode()


def test_other_transformations_are_not_claimed() -> None:
    # Documented limits: a reversed or split secret is not recognised.
    assert hidden(TOKEN[::-1]) == TOKEN[::-1]
    assert hidden(" ".join(TOKEN)) == " ".join(TOKEN)


def test_an_encoded_secret_split_across_stream_chunks_is_redacted() -> None:
    encoded = base64.b64encode(TOKEN.encode()).decode()
    text = f"before {encoded} after"
    for cut in range(1, len(text)):
        red = StreamRedactor(expand((TOKEN,)))
        out = stream(red, [text[:cut], text[cut:]])
        assert out == f"before {REDACTED} after", cut


# -- secrets as files -------------------------------------------------------------------


def test_secret_as_file_repr_and_equality() -> None:
    s = Secret(VALUE, as_file=True)
    assert VALUE not in repr(s) and "as_file=True" in repr(s)
    assert s != Secret(VALUE)
    assert s == Secret(VALUE, as_file=True)


def test_file_secrets_stay_out_of_the_container_environment() -> None:
    config = SandboxConfig(
        image="img", environment={"API_KEY": Secret(VALUE, as_file=True), "TOKEN": Secret("t0k3n"), "A": "b"}
    )
    env = config.container_environment()
    assert env == {"API_KEY_FILE": f"{SECRET_DIR}/API_KEY", "TOKEN": "t0k3n", "A": "b"}
    assert VALUE not in repr(env)
    assert config.secret_files == {"API_KEY": VALUE}
    assert set(config.secrets) == {VALUE, "t0k3n"}


def test_file_secret_name_file_conflict_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="API_KEY_FILE"):
        SandboxConfig(image="img", environment={"API_KEY": Secret(VALUE, as_file=True), "API_KEY_FILE": "/x"})
