"""What the agent says of a file is untrusted: an entry that is not a sane stat is refused."""

from __future__ import annotations

from typing import Any

import pytest

from agentnest._files import _file_info
from agentnest.errors import ChannelError

GOOD = ["a.txt", "file", 12, 0o100644, 1_700_000_000.5]


def test_a_sane_entry_is_read() -> None:
    info = _file_info(GOOD)
    assert (info.path, info.type, info.size, info.mode, info.mtime) == tuple(GOOD)


@pytest.mark.parametrize(
    ("index", "value"),
    [
        (0, 7),  # path not a string
        (1, "device"),  # unknown kind
        (2, -1),  # negative size
        (2, True),  # a bool is not a size
        (2, 1.5),  # nor a float
        (3, -1),  # negative mode
        (3, 0o1000000),  # mode past 16 bits
        (3, False),
        (4, float("nan")),
        (4, float("inf")),
        (4, "yesterday"),
        (4, True),
    ],
)
def test_an_insane_entry_is_refused(index: int, value: Any) -> None:
    entry = list(GOOD)
    entry[index] = value
    with pytest.raises(ChannelError, match="invalid file entry"):
        _file_info(entry)


@pytest.mark.parametrize("entry", [None, [], GOOD[:4], [*GOOD, 1], "abcde"])
def test_an_entry_of_the_wrong_shape_is_refused(entry: Any) -> None:
    with pytest.raises(ChannelError, match="invalid file entry"):
        _file_info(entry)
