"""The partition count: followed (or kept) once known."""

from __future__ import annotations

import logging
import time

from ktimers.errors import BrokersUnreachableError, TopicLayoutError
from oscillator.partitions import PartitionWatcher


class Reads:
    """A metadata source answering from a script (ints are counts, exceptions are raised).

    The last answer repeats once the script runs out.
    """

    def __init__(self, *answers: int | Exception) -> None:
        self.answers = list(answers)

    def __call__(self) -> int:
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_refresh_follows_added_partitions() -> None:
    watcher = PartitionWatcher(Reads(6), refresh_s=60, count=4)
    try:
        assert watcher.count == 4
        watcher.refresh()
        assert watcher.count == 6
    finally:
        watcher.stop()


def test_failed_refresh_keeps_ticking_the_known_partitions(caplog) -> None:
    watcher = PartitionWatcher(
        Reads(BrokersUnreachableError("broker timed out"), TopicLayoutError("topic 'osc' does not exist")),
        refresh_s=60,
        count=4,
    )
    try:
        watcher.start()
        with caplog.at_level(logging.WARNING, logger="oscillator.partitions"):
            watcher.refresh()
            watcher.refresh()
        assert watcher.count == 4
        levels = {r.levelname: r.getMessage() for r in caplog.records}
        assert "broker timed out" in levels["WARNING"]
        assert "does not exist" in levels["ERROR"]  # an operator must act: deleted topic
    finally:
        watcher.stop()


def test_background_refresh_picks_up_the_new_count() -> None:
    watcher = PartitionWatcher(Reads(8), refresh_s=0.01, count=4)
    try:
        watcher.start()
        for _ in range(200):
            if watcher.count == 8:
                break
            time.sleep(0.01)
        assert watcher.count == 8
    finally:
        watcher.stop()
