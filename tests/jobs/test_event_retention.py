"""Compaction refuses a log whose FIRED events may have left `timer-events` (embedded broker).

Tansu stores ``retention.ms`` but never deletes: the
events are all there, and the job must still refuse on the topic's word, as on a
Kafka cluster that would have deleted them. The deleted-records path is in
test_retention.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from pyspark.sql import SparkSession

from futures.jobs import snapshot
from futures.jobs.compact import CompactOptions, print_result
from futures.jobs.compact import run as compact
from futures.jobs.config import JobConfig
from futures.jobs.errors import SnapshotError
from ktimers.wire import Future, TimerEvent
from tests.integration.conftest import fresh_env

pytestmark = pytest.mark.integration

MINUTE = 60_000


def set_retention(config: JobConfig, topic: str, ms: int) -> None:
    admin = AdminClient(config.common.kafka.librdkafka())
    entry = ConfigEntry("retention.ms", str(ms), incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
    admin.incremental_alter_configs([resource])[resource].result()


@pytest.fixture
def config(broker_env: dict[str, str]) -> JobConfig:
    """Three timers: fired 10 min ago (its FIRED event is on timer-events), one due then whose
    event is missing (it fired, the event was deleted: to compaction it is pending), one due tomorrow."""
    config = JobConfig.from_env(fresh_env(broker_env))
    topics = config.common.topics
    now = time.time_ns() // 1_000_000
    producer = Producer(config.common.kafka.librdkafka())
    offsets: dict[str, int] = {}

    def delivered(err, msg) -> None:
        assert err is None
        offsets[msg.key().decode()] = msg.offset()

    due = {"fired": now - 10 * MINUTE, "lost": now - 10 * MINUTE, "tomorrow": now + 1440 * MINUTE}
    for timer_id, due_ms in due.items():
        future = Future(callBackTopic="cb-x", callBackKey="k", callBack=b"p", id=timer_id, due_ms=due_ms)
        producer.produce(topics.request, future.SerializeToString(), timer_id.encode(), partition=0,
                         on_delivery=delivered)  # fmt: skip
        assert producer.flush(10) == 0
    event = TimerEvent(id="fired", kind=TimerEvent.Kind.FIRED, partition=0, source_offset=offsets["fired"],
                       due_ms=due["fired"], at_ms=due["fired"] + 5)  # fmt: skip
    producer.produce(topics.events, event.SerializeToString(), b"fired")
    assert producer.flush(10) == 0
    return config


def test_compaction_refuses_when_retention_may_have_deleted_fired_events(
    spark: SparkSession, config: JobConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Events kept for ever (or for Kafka's default week): nothing can be missing.
    kept = compact(spark, config, CompactOptions(out=str(tmp_path / "kept")))
    assert (kept.counts.fired, kept.counts.pending, kept.unchecked, kept.event_loss) == (1, 2, 0, None)

    # Events kept one minute: the FIRED event of a timer due ten minutes ago may be gone.
    set_retention(config, config.common.topics.events, MINUTE)
    refused = tmp_path / "refused"
    with pytest.raises(SnapshotError) as info:
        compact(spark, config, CompactOptions(out=str(refused)))
    message = str(info.value)
    assert "retention.ms=60000 (1 minute)" in message
    assert "1 pending timer due before" in message and "--accept-event-loss" in message
    assert not snapshot.exists(spark, str(refused))

    accepted = tmp_path / "accepted"
    options = CompactOptions(out=str(accepted), accept_event_loss=True)
    result = compact(spark, config, options)
    assert (result.counts.fired, result.counts.pending, result.unchecked) == (1, 2, 1)
    assert snapshot.read_manifest(spark, str(accepted)).counts["unchecked"] == 1
    print_result(result, options)
    assert "unchecked              1  pending, but their FIRED event may be gone" in capsys.readouterr().out


def test_a_loss_before_every_pending_due_time_is_no_reason_to_refuse(
    spark: SparkSession, config: JobConfig, tmp_path: Path
) -> None:
    # Events kept a day: the timer due ten minutes ago cannot have lost its FIRED event yet.
    set_retention(config, config.common.topics.events, 1440 * MINUTE)
    result = compact(spark, config, CompactOptions(out=str(tmp_path / "s")))
    assert result.event_loss is not None and result.unchecked == 0
    assert result.counts.pending == 2
