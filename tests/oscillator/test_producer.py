"""TickProducer against a fake producer: what goes on the wire and what delivery reports do."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError

from ktimers.errors import DeliveryError
from oscillator.health import Liveness
from oscillator.metrics import OscillatorMetrics
from oscillator.producer import TickProducer
from tests.oscillator.fakes import FakeClock, FakeProducer, fatal_error, fatal_exception


@pytest.fixture
def parts():
    producer = FakeProducer()
    metrics = OscillatorMetrics()
    monotonic = FakeClock(0.0)
    liveness = Liveness(stale_after_s=5.0, clock=monotonic)
    wall = FakeClock(1_700_000_042.0371)
    ticks = TickProducer(producer, "osc", "osc-a", metrics, liveness, clock=wall)
    return ticks, producer, metrics, liveness, monotonic


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
    ticks, producer, metrics, liveness, monotonic = parts
    ticks.send(1_700_000_042, partitions=4)
    monotonic.advance(6.0)  # past the startup grace: only a delivery makes it healthy
    assert not liveness.check()[0]

    producer.deliver()

    assert sample(metrics, "timers_oscillator_ticks_delivered_total") == 4.0
    assert sample(metrics, "timers_oscillator_last_second_delivered") == 1_700_000_042
    assert liveness.check() == (True, "ok")


def test_produced_but_undelivered_ticks_do_not_count_as_healthy(parts) -> None:
    ticks, producer, metrics, liveness, monotonic = parts
    monotonic.advance(6.0)

    ticks.send(1_700_000_042, partitions=4)

    assert not liveness.check()[0]
    assert sample(metrics, "timers_oscillator_ticks_delivered_total") == 0.0


def test_delivery_error_is_counted_and_logged_with_its_text(parts, caplog) -> None:
    ticks, producer, metrics, liveness, monotonic = parts
    ticks.send(1_700_000_042, partitions=2)
    monotonic.advance(6.0)

    with caplog.at_level(logging.ERROR, logger="oscillator.producer"):
        producer.deliver(KafkaError(KafkaError._MSG_TIMED_OUT, "Message timed out"))

    assert sample(metrics, "timers_oscillator_produce_errors_total") == 2.0
    assert sample(metrics, "timers_oscillator_ticks_delivered_total") == 0.0
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2
    assert all("Message timed out" in message and "1700000042" in message for message in errors)
    assert not liveness.check()[0]


def test_lost_tick_does_not_stop_the_next_second(parts) -> None:
    ticks, producer, metrics, *_ = parts
    ticks.send(1_700_000_042, partitions=2)
    producer.deliver(KafkaError(KafkaError._MSG_TIMED_OUT, "Message timed out"))

    ticks.send(1_700_000_043, partitions=2)
    producer.deliver()

    assert sample(metrics, "timers_oscillator_last_second_delivered") == 1_700_000_043


def test_fatal_delivery_error_stops_the_next_send(parts) -> None:
    ticks, producer, *_ = parts
    ticks.send(1_700_000_042, partitions=2)
    producer.deliver(fatal_error("Producer fenced by a newer instance"))

    with pytest.raises(DeliveryError, match="Producer fenced by a newer instance"):
        ticks.send(1_700_000_043, partitions=2)
    assert [r.tick.second for r in producer.records] == [1_700_000_042] * 2


def test_fatal_produce_error_raises_at_once(parts) -> None:
    ticks, producer, *_ = parts
    producer.produce_error = fatal_exception("out of order sequence")

    with pytest.raises(DeliveryError, match="out of order sequence"):
        ticks.send(1_700_000_042, partitions=2)


def test_full_local_queue_loses_only_that_record(parts) -> None:
    ticks, producer, metrics, *_ = parts
    producer.produce_error = BufferError("Local: Queue full")
    producer.fail_partitions = {1}

    ticks.send(1_700_000_042, partitions=3)

    assert sorted(r.partition for r in producer.records) == [0, 2]
    assert sample(metrics, "timers_oscillator_produce_errors_total") == 1.0
