"""The manager's database writer: what ``queued`` promises readers."""

from __future__ import annotations

import threading
from typing import Any

import anyio

from agentnest.server.recorder import Recorder


class SlowDatabase:
    """Applies a batch only when told to (the write a reader may race)."""

    display = "slow"

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.applied: list[Any] = []

    def apply(self, batch: list[Any]) -> None:
        self.entered.set()
        self.release.wait(10)
        self.applied.extend(batch)


def test_a_batch_being_written_still_counts_as_queued() -> None:
    """``queued == 0`` means every record queued before is readable in the database: a batch taken
    off the queue but not yet written still counts (the race a reader of an end row lost)."""
    database = SlowDatabase()
    recorder = Recorder(database, server="s1")  # type: ignore[arg-type]
    recorder.ended("sb1", "gone")
    seen: list[int] = []

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(recorder.flush)
            await anyio.to_thread.run_sync(database.entered.wait, 10)
            seen.append(recorder.queued)  # mid-write
            database.release.set()
        seen.append(recorder.queued)  # written

    anyio.run(main)
    assert seen == [1, 0]
    assert [kind for kind, _row in database.applied] == ["end"]


def test_a_failed_write_puts_its_batch_back_and_counts_it_once() -> None:
    class Down(SlowDatabase):
        def apply(self, batch: list[Any]) -> None:
            raise RuntimeError("down")

    recorder = Recorder(Down(), server="s1")  # type: ignore[arg-type]
    recorder.ended("sb1", "gone")
    recorder.ended("sb2", "gone")

    async def main() -> None:
        try:
            await recorder.flush()
        except RuntimeError:
            pass
        else:
            raise AssertionError("the write failed silently")

    anyio.run(main)
    assert recorder.queued == 2
