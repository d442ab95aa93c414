"""TickProducer against fake producers: what goes on the wire, what delivery reports do, and when
a producer the brokers refuse is replaced."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError

from oscillator.health import Readiness
from oscillator.metrics import OscillatorMetrics
from oscillator.producer import REFUSED_FOR_S, TickProducer
from tests.oscillator.fakes import FakeClock, FakeProducer, fatal_error, fatal_exception

FENCED = KafkaError(
    KafkaError.PRODUCER_FENCED,
    "Broker: There is a newer producer with the same transactionalId which fences the current one",
)


class Producers:
    """Makes fake producers and keeps them: ``made[-1]`` is the one in use."""

    def __init__(self) -> None:
        self.made: list[FakeProducer] = []

    def __call__(self) -> FakeProducer:
        self.made.append(FakeProducer())
        return self.made[-1]


@pytest.fixture
def parts():
    metrics = OscillatorMetrics()
    monotonic = FakeClock(0.0)
    readiness = Readiness(stale_after_s=5.0, clock=monotonic)
    wall = FakeClock(1_700_000_042.0371)
    producers = Producers()
    ticks = TickProducer(producers, "osc", "osc-a", metrics, readiness, clock=wall, monotonic=monotonic)
    return ticks, producers.made[0], metrics, readiness, monotonic, producers


def sample(metrics: OscillatorMetrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(name)


def test_one_tick_per_partition_keyed_by_the_decimal_second(parts) -> None:
    ticks, producer, *_ = parts

    ticks.send(1_700_000_042, partitions=4)

    assert sorted(r.partition for r in producer.records) == [0, 1, 2, 3]
    for record in producer.records:
        assert record.topic == "osc"
        assert record.key == b"1700000042"
        assert record.tick.second == 1_700_000_042
        assert record.tick.source == "osc-a"
        assert record.tick.emitted_ms == 1_700_000_042_037


def test_deliveries_feed_metrics_and_health(parts) -> None:
    ticks, producer, metrics, readiness, *_ = parts
    ticks.send(1_700_000_042, partitions=4)
    assert not readiness.check()[0]

    producer.deliver()

    assert sample(metrics, "timers_oscillator_ticks_delivered_total") == 4.0
    assert sample(metrics, "timers_oscillator_last_second_delivered") == 1_700_000_042
    assert readiness.check() == (True, "ok")


def test_produced_but_undelivered_ticks_do_not_count_as_healthy(parts) -> None:
    ticks, producer, metrics, readiness, *_ = parts

    ticks.send(1_700_000_042, partitions=4)

    assert not readiness.check()[0]
    assert sample(metrics, "timers_oscillator_ticks_delivered_total") == 0.0


def test_an_outage_is_counted_and_logged_once_with_its_text_and_its_end(parts, caplog) -> None:
    ticks, producer, metrics, readiness, monotonic, _ = parts

    with caplog.at_level(logging.INFO, logger="oscillator.producer"):
        for second in range(1_700_000_042, 1_700_000_052):  # ten seconds of ticks timing out
            ticks.send(second, partitions=2)
            monotonic.advance(1.0)
            producer.deliver(KafkaError(KafkaError._MSG_TIMED_OUT, "Message timed out"))
        ticks.send(1_700_000_052, partitions=2)
        producer.deliver()

    assert sample(metrics, "timers_oscillator_produce_errors_total") == 20.0
    assert sample(metrics, "timers_oscillator_ticks_delivered_total") == 2.0
    [lost, back] = [r.getMessage() for r in caplog.records]
    assert "Message timed out" in lost and "1700000042" in lost
    assert "acknowledged again, after 9.0s; 20 tick record(s) were lost" in back
    assert readiness.check() == (True, "ok")


def test_lost_tick_does_not_stop_the_next_second(parts) -> None:
    ticks, producer, metrics, *_ = parts
    ticks.send(1_700_000_042, partitions=2)
    producer.deliver(KafkaError(KafkaError._MSG_TIMED_OUT, "Message timed out"))

    ticks.send(1_700_000_043, partitions=2)
    producer.deliver()

    assert sample(metrics, "timers_oscillator_last_second_delivered") == 1_700_000_043


def test_a_fatal_error_replaces_the_producer_and_the_next_second_goes_out_on_the_new_one(parts) -> None:
    ticks, first, _, readiness, _, producers = parts
    ticks.send(1_700_000_042, partitions=2)
    first.deliver(fatal_error("Producer fenced by a newer instance"))

    ticks.send(1_700_000_043, partitions=2)
    producers.made[-1].deliver()

    assert len(producers.made) == 2
    assert [r.tick.second for r in first.records] == [1_700_000_042] * 2
    assert [r.tick.second for r in producers.made[1].records] == [1_700_000_043] * 2
    assert readiness.check() == (True, "ok")


def test_a_fatal_produce_error_replaces_the_producer_at_the_next_second(parts) -> None:
    ticks, first, _, _, _, producers = parts
    first.produce_error = fatal_exception("out of order sequence")

    ticks.send(1_700_000_042, partitions=2)
    ticks.send(1_700_000_043, partitions=2)

    assert first.records == []
    assert [r.tick.second for r in producers.made[1].records] == [1_700_000_043] * 2


def test_a_producer_the_brokers_keep_fencing_is_replaced_and_ticks_resume(parts, caplog) -> None:
    ticks, first, _, readiness, monotonic, producers = parts
    seconds = iter(range(1_700_000_042, 1_700_000_062))
    with caplog.at_level(logging.WARNING, logger="oscillator.producer"):
        for second in seconds:
            ticks.send(second, partitions=2)
            if len(producers.made) > 1:
                break
            first.deliver(FENCED)
            monotonic.advance(1.0)
        producers.made[-1].deliver()

    assert len(producers.made) == 2
    # Refused for REFUSED_FOR_S, then that second went out on a new producer.
    refused = sorted({r.tick.second for r in first.records})
    assert len(refused) == REFUSED_FOR_S
    assert [r.tick.second for r in producers.made[1].records] == [refused[-1] + 1] * 2
    replacing = [r.getMessage() for r in caplog.records if "replacing the tick producer" in r.getMessage()]
    assert len(replacing) == 1 and "fences the current one" in replacing[0]
    assert readiness.check() == (True, "ok")


def test_timeouts_while_the_brokers_are_away_keep_the_producer(parts) -> None:
    ticks, first, _, _, monotonic, producers = parts
    for second in range(1_700_000_042, 1_700_000_142):
        ticks.send(second, partitions=2)
        monotonic.advance(1.0)
        first.deliver(KafkaError(KafkaError._MSG_TIMED_OUT, "Message timed out"))

    assert producers.made == [first]


def test_a_refusal_between_deliveries_keeps_the_producer(parts) -> None:
    ticks, first, _, _, monotonic, producers = parts
    for second in range(1_700_000_042, 1_700_000_062):
        ticks.send(second, partitions=2)
        monotonic.advance(1.0)
        first.deliver(FENCED if second % 2 else None)

    assert producers.made == [first]


def test_full_local_queue_loses_only_that_record(parts) -> None:
    ticks, producer, metrics, *_ = parts
    producer.produce_error = BufferError("Local: Queue full")
    producer.fail_partitions = {1}

    ticks.send(1_700_000_042, partitions=3)

    assert sorted(r.partition for r in producer.records) == [0, 2]
    assert sample(metrics, "timers_oscillator_produce_errors_total") == 1.0
