"""Callbacks produced straight to the receiver on their due millisecond: what precise mode stands on.

Precise mode's lateness at the receiver is what the worker adds (at dispatch: ``kt-fired-ms`` −
due) plus the way from its producer to the receiver: librdkafka's linger, the broker, the
receiver's fetch. This measures that way alone, on the same broker in the same run: a producer
configured as precise mode's (:func:`futures.worker.kafka.producer_config`) writes records
shaped like callbacks — key, 100-byte payload, the ``kt-*`` headers — each on its due
millisecond, at a steady rate, to the same receiver the workloads use. No timer service can
deliver a callback sooner after its due time than this.
"""

from __future__ import annotations

import time

from confluent_kafka import Producer

from bench.cluster import PARTITIONS, BenchError
from bench.collector import Collector
from bench.fire import FireContext, finish
from bench.results import DIRECT, Fire
from bench.workload import PAYLOAD, callback_headers, callback_key, even_due_times, now_ms
from futures.worker.kafka import PRECISE_LINGER_MS, producer_config

#: How often the producer looks for records come due (s): well under a millisecond late.
TURN_S = 0.0005


def measure(ctx: FireContext, rate: int, duration_s: float, lead_s: float) -> Fire:
    """Records due at ``rate`` per second for ``duration_s``, each produced on its due millisecond,
    the first ``lead_s`` from now: the receiver has been fetching as long as it has for a
    workload's timers requested that far ahead (its first fetches take a while to settle)."""
    count = int(rate * duration_s)
    workload = f"direct-{rate}"
    topic = ctx.broker.create_topic(f"bench-cb-{workload}")
    collector = Collector(ctx.broker, topic, count, ctx.work_dir / f"{workload}.npy")
    collector.start(deadline=time.time() + lead_s + duration_s + ctx.tail_timeout_s)
    try:
        origin_ms = now_ms() + int(lead_s * 1000)
        due = even_due_times(count, origin_ms, duration_s)
        producer = Producer(producer_config(ctx.broker.common.kafka, linger_ms=PRECISE_LINGER_MS))
        sent = 0
        while sent < count:
            now = now_ms()
            while sent < count and due[sent] <= now:
                headers = callback_headers(due[sent], now)
                producer.produce(
                    topic, PAYLOAD, callback_key(sent), partition=sent % PARTITIONS, headers=headers
                )
                sent += 1
            producer.poll(0)
            time.sleep(TURN_S)
        if producer.flush(ctx.tail_timeout_s) > 0:
            raise BenchError(f"direct produce: records to {topic} not delivered")
        arrivals = collector.finish()
    finally:
        collector.stop()
    fire = finish(DIRECT, workload, count, arrivals, origin_ms, 1.0)
    fire.window_s = duration_s
    return fire
