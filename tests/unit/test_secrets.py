"""Secret values and their redaction (secrets.py), including across stream chunks."""

from __future__ import annotations

import copy
import pickle
import random

import pytest

from agentnest.errors import AgentNestError, ConfigurationError
from agentnest.secrets import REDACTED, Secret, StreamRedactor, redact

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


@pytest.mark.parametrize("value", ["", None, 5, b"bytes"], ids=repr)
def test_secret_needs_a_non_empty_str(value: object) -> None:
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
        Secret("")
