"""The partition count: fatal when unknown at start, followed (or kept) afterwards."""

from __future__ import annotations

import logging
import time

import pytest

from ktimers.errors import TopicLayoutError
from oscillator.errors import MetadataError
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


def test_missing_topic_at_start_is_an_error() -> None:
    watcher = PartitionWatcher(Reads(TopicLayoutError("topic 'osc' does not exist")), refresh_s=60)

    with pytest.raises(TopicLayoutError, match="does not exist"):
        watcher.start()


def test_refresh_follows_added_partitions() -> None:
    watcher = PartitionWatcher(Reads(4, 6), refresh_s=60)
    try:
        assert watcher.start() == 4
        watcher.refresh()
        assert watcher.count == 6
    finally:
        watcher.stop()


def test_failed_refresh_keeps_ticking_the_known_partitions(caplog) -> None:
    watcher = PartitionWatcher(
        Reads(4, MetadataError("broker timed out"), TopicLayoutError("topic 'osc' does not exist")),
        refresh_s=60,
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
    watcher = PartitionWatcher(Reads(4, 8), refresh_s=0.01)
    try:
        watcher.start()
        for _ in range(200):
            if watcher.count == 8:
                break
            time.sleep(0.01)
        assert watcher.count == 8
    finally:
        watcher.stop()
