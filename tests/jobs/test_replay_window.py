"""Re-sending callbacks of a due window never fires a timer early (embedded broker, no worker)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from futures.jobs.config import JobConfig
from futures.jobs.outputs import callback_records, write_records
from futures.jobs.replay import ReplayOptions
from futures.jobs.replay import run as replay
from futures.jobs.runner import UsageError
from ktimers.wire import H_DUE_MS, H_FIRED_MS, H_ID, Future, header_value
from tests.integration.conftest import fresh_env

pytestmark = pytest.mark.integration

MINUTE = 60_000


@dataclass(frozen=True)
class Sent:
    """A callback as the broker holds it."""

    timer_id: str
    due_ms: int
    fired_ms: int  # kt-fired-ms
    produced_ms: int  # the record's timestamp: when the job produced it


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def create_topic(bootstrap: str, name: str, partitions: int = 2) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result()
    return name


def read_all(bootstrap: str, topic: str, settle_s: float = 1.5, partitions: int = 2) -> list[Sent]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 50})  # fmt: skip
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    sent = []
    deadline = time.monotonic() + settle_s
    try:
        while time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=0.1):
                if msg.error() is None:
                    h = msg.headers() or []
                    sent.append(
                        Sent(
                            (header_value(h, H_ID) or b"").decode(),
                            int(header_value(h, H_DUE_MS) or 0),
                            int(header_value(h, H_FIRED_MS) or 0),
                            msg.timestamp()[1],
                        )
                    )
    finally:
        consumer.close()
    return sent


def future(timer_id: str, due_ms: int, topic: str) -> Future:
    return Future(callBackTopic=topic, callBackKey=timer_id, callBack=b"p", id=timer_id, due_ms=due_ms)


@pytest.fixture
def window(broker_env: dict[str, str]) -> tuple[JobConfig, str, int, dict[str, int]]:
    """A request log of pending timers (no worker runs): two overdue, two not yet due.

    Returns the job config, the callback topic, the time the log was written and the due times.
    """
    env = fresh_env(broker_env)
    config = JobConfig.from_env(env)
    callbacks = create_topic(env["KAFKA_BOOTSTRAP_SERVERS"], f"cb-window-{uuid.uuid4().hex[:6]}")
    t = now_ms()
    due = {"overdue-1": t - 2 * MINUTE, "overdue-2": t - 5_000, "soon": t + 30_000, "later": t + 60 * MINUTE}
    producer = Producer({"bootstrap.servers": env["KAFKA_BOOTSTRAP_SERVERS"]})
    for i, (timer_id, due_ms) in enumerate(due.items()):
        value = future(timer_id, due_ms, callbacks).SerializeToString()
        producer.produce(config.common.topics.request, value, timer_id.encode(), partition=i % 4)
    assert producer.flush(10) == 0
    return config, callbacks, t, due


def test_a_window_reaching_into_the_future_is_refused_and_sends_nothing(
    spark: SparkSession, window: tuple[JobConfig, str, int, dict[str, int]]
) -> None:
    config, callbacks, t, _ = window
    options = ReplayOptions(to_topic=callbacks, due_from_ms=t - 10 * MINUTE, due_to_ms=t + 120 * MINUTE)
    with pytest.raises(UsageError, match=r"--due-to .* is in the future.*--due-to now.*timer-request"):
        replay(spark, config, options)
    with pytest.raises(UsageError, match="in the future"):
        replay(spark, config, ReplayOptions(**{**options.__dict__, "dry_run": True}))
    assert read_all(config.common.kafka.bootstrap_servers, callbacks, settle_s=1.0) == []


def test_a_window_up_to_now_sends_only_due_timers_never_before_their_due_time(
    spark: SparkSession, window: tuple[JobConfig, str, int, dict[str, int]]
) -> None:
    config, callbacks, t, due = window
    options = ReplayOptions(to_topic=callbacks, due_from_ms=t - 10 * MINUTE, due_to_ms=now_ms())
    result = replay(spark, config, options)
    assert result.records == 2
    sent = read_all(config.common.kafka.bootstrap_servers, callbacks)
    assert sorted(s.timer_id for s in sent) == ["overdue-1", "overdue-2"]
    for s in sent:
        assert s.due_ms == due[s.timer_id]
        assert s.fired_ms >= s.due_ms and s.produced_ms >= s.due_ms, s


def test_the_writer_waits_for_a_callback_a_moment_ahead_and_refuses_one_far_ahead(
    spark: SparkSession, broker_env: dict[str, str]
) -> None:
    """The last line of defence, where records are produced: an executor clock behind the driver's."""
    bootstrap = broker_env["KAFKA_BOOTSTRAP_SERVERS"]
    config = JobConfig.from_env(broker_env)
    topic = create_topic(bootstrap, f"cb-guard-{uuid.uuid4().hex[:6]}")

    def timers(*due: tuple[str, int]):
        rows = [(future(i, d, topic).SerializeToString(), 0, n) for n, (i, d) in enumerate(due)]
        return spark.createDataFrame(rows, "future binary, partition int, offset long")

    ahead = now_ms() + 1_500
    write_records(callback_records(timers(("past", now_ms() - 1_000), ("ahead", ahead))), config.common)
    sent = {s.timer_id: s for s in read_all(bootstrap, topic)}
    assert set(sent) == {"past", "ahead"}
    assert sent["ahead"].fired_ms >= ahead and sent["ahead"].produced_ms >= ahead

    far = timers(("far", now_ms() + 10 * MINUTE))
    with pytest.raises(PySparkException, match="refusing to send the callback of timer 'far'"):
        write_records(callback_records(far), config.common)
    assert "far" not in {s.timer_id for s in read_all(bootstrap, topic, settle_s=1.0)}
