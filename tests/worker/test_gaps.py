"""The read-back reads requests as the worker's consumer does: committed transactions only."""

from __future__ import annotations

from typing import Any

from futures.worker import gaps
from ktimers.config import KafkaConfig


def test_the_read_back_reads_only_committed_transactions_as_the_consumer_does(monkeypatch: Any) -> None:
    made: list[dict[str, Any]] = []

    class Consumer:
        def __init__(self, config: dict[str, Any]) -> None:
            made.append(config)

    monkeypatch.setattr(gaps, "Consumer", Consumer)
    gaps.KafkaGapReader(KafkaConfig())
    [config] = made
    # A request of an aborted transaction must not apply through a hole read back either.
    assert config["isolation.level"] == "read_committed"
