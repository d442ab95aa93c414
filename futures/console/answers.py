"""The worker's answer to a request the command sent: its event on ``timer-events``.

:class:`EventTail` first reads every partition of ``timer-events`` to its end, then the
command sends its request: whatever event about the timer comes after is the answer to it.
The end is where a fetch finds no more records (librdkafka's partition EOF), not what a
ListOffsets request says: some brokers (the embedded one) under-report it, and an older
answer about the same id (an earlier cancel) would then be taken for this one.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

from futures.console.decode import events_of
from ktimers.config import CommonConfig
from ktimers.errors import TimersError
from ktimers.wire import TimerEvent, message_headers

#: Longest wait for one poll (seconds), so a deadline is kept to about this.
POLL_S = 0.2


class EventTail:
    """Reads ``timer-events`` from its current end; a context manager that closes its consumer."""

    def __init__(self, common: CommonConfig, logger: Any) -> None:
        self._common = common
        self._topic = common.topics.events
        self._consumer = Consumer(
            {
                **common.kafka.librdkafka(),
                "group.id": f"timers-cli-{uuid.uuid4().hex[:12]}",  # assign() only: nothing committed
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "fetch.wait.max.ms": 100,
                "logger": logger,
            }
        )

    def __enter__(self) -> EventTail:
        return self

    def __exit__(self, *exc: object) -> None:
        self._consumer.close()

    def catch_up(self, deadline: float) -> None:
        """Read every partition to its end, by ``deadline`` (monotonic seconds); raises
        :class:`TimersError` when the topic is missing or its end was not reached in time."""
        try:
            metadata = self._consumer.list_topics(timeout=max(0.1, deadline - time.monotonic()))
        except KafkaException as exc:
            raise TimersError(
                f"cannot read {self._topic!r} on {self._common.kafka.bootstrap_servers}: {exc}"
            ) from exc
        info = metadata.topics.get(self._topic)
        if info is None or info.error is not None or not info.partitions:
            raise TimersError(
                f"topic {self._topic!r} does not exist on {self._common.kafka.bootstrap_servers}: "
                "check TIMERS_TOPIC_EVENTS (or run `timers topics create`)"
            )
        waiting = set(info.partitions)
        self._consumer.assign([TopicPartition(self._topic, p, OFFSET_END) for p in sorted(waiting)])
        while waiting:
            if time.monotonic() >= deadline:
                raise TimersError(
                    f"could not read {self._topic!r} to its end in time (partitions {sorted(waiting)} "
                    "did not answer): check that the brokers are up, or give a longer --timeout"
                )
            msg = self._consumer.poll(POLL_S)
            if msg is None:
                continue
            err = msg.error()
            if err is None:
                continue
            if err.code() == KafkaError._PARTITION_EOF:
                waiting.discard(msg.partition())
            elif err.fatal():
                raise KafkaException(err)

    def wait_for(self, timer_id: str, kinds: Collection[int], deadline: float) -> TimerEvent | None:
        """The first event of ``kinds`` about ``timer_id`` read before ``deadline``; None if none came."""
        while time.monotonic() < deadline:
            msg = self._consumer.poll(min(POLL_S, max(0.0, deadline - time.monotonic())))
            if msg is None or msg.error() is not None:
                continue
            headers = message_headers(msg)
            try:
                events = events_of(msg.value(), headers or ())
            except ValueError:
                continue  # not an event record: nobody's answer
            for event in events:
                if event.id == timer_id and event.kind in kinds:
                    return event
        return None
