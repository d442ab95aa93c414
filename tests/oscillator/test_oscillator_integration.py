"""The oscillator as a real process against the test broker: what the workers would receive."""

from __future__ import annotations

import signal
import time
import urllib.error
import urllib.request
import uuid
from collections import defaultdict

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from ktimers.broker import free_port
from ktimers.config import CommonConfig
from ktimers.topics import create_topics
from ktimers.wire import Tick
from oscillator.partitions import admin_client

pytestmark = pytest.mark.integration

PARTITIONS = 4
RUN_S = 4.0


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - local test server
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metric(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} not in /metrics:\n{text}")


def read_all_ticks(env: dict[str, str], idle_s: float = 1.5, timeout_s: float = 20.0):
    """Every record of the oscillator topic as (partition, key, Tick), read until it goes quiet.

    Partitions are assigned, not subscribed: a group join would cost seconds.
    """
    common = CommonConfig.from_env(env)
    consumer = Consumer(
        {
            **common.kafka.librdkafka(),
            "group.id": f"osc-test-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    topic = common.topics.oscillator
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    records = []
    deadline = time.monotonic() + timeout_s
    last_seen = time.monotonic()
    try:
        while time.monotonic() < deadline and (not records or time.monotonic() - last_seen < idle_s):
            message = consumer.poll(0.2)
            if message is None:
                continue
            assert message.error() is None, message.error()
            records.append((message.partition(), message.key(), Tick.FromString(message.value())))
            last_seen = time.monotonic()
    finally:
        consumer.close()
    return records


def seconds_by_partition(records, source: str | None = None) -> dict[int, list[int]]:
    by_partition: dict[int, list[int]] = defaultdict(list)
    for partition, _, tick in records:
        if source is None or tick.source == source:
            by_partition[partition].append(tick.second)
    return dict(by_partition)


def test_ticks_every_partition_once_a_second_and_stops_cleanly(spawn, timers_env) -> None:
    port = free_port()
    osc = spawn(
        "oscillator",
        ["-m", "oscillator.main"],
        {**timers_env, "TIMERS_OSC_HEALTH_PORT": str(port), "TIMERS_OSC_INSTANCE": "osc-a"},
    )
    osc.wait_for_output("oscillator started", timeout_s=20)
    time.sleep(RUN_S)

    status, body = get(f"http://127.0.0.1:{port}/healthz")
    assert (status, body) == (200, "ok")
    _, metrics_text = get(f"http://127.0.0.1:{port}/metrics")
    assert metric(metrics_text, "timers_oscillator_ticks_delivered_total") >= PARTITIONS
    assert metric(metrics_text, "timers_oscillator_produce_errors_total") == 0

    started = time.monotonic()
    assert osc.stop(timeout_s=10) == 0
    assert time.monotonic() - started < 3.0, "SIGTERM should stop the oscillator promptly"
    assert "oscillator stopped (SIGTERM)" in osc.output()

    records = read_all_ticks(timers_env)
    for _, key, tick in records:
        assert key == str(tick.second).encode()
        assert tick.source == "osc-a"
        assert tick.emitted_ms >= tick.second * 1000, (
            f"tick for {tick.second} sent early at {tick.emitted_ms}"
        )
    by_partition = seconds_by_partition(records)
    assert set(by_partition) == set(range(PARTITIONS))
    for partition, seconds in by_partition.items():
        assert len(seconds) >= 3, f"partition {partition} got only {seconds} in {RUN_S}s"
        assert seconds == list(range(seconds[0], seconds[0] + len(seconds))), (partition, seconds)
    # The last tick was flushed at shutdown and reached every partition alike.
    assert len({seconds[-1] for seconds in by_partition.values()}) == 1


def test_two_instances_tick_every_partition_twice_a_second(spawn, timers_env) -> None:
    instances = {}
    for name in ("osc-a", "osc-b"):
        env = {**timers_env, "TIMERS_OSC_HEALTH_PORT": str(free_port()), "TIMERS_OSC_INSTANCE": name}
        instances[name] = spawn(name, ["-m", "oscillator.main"], env)
    for service in instances.values():
        service.wait_for_output("oscillator started", timeout_s=20)
    time.sleep(RUN_S)

    assert instances["osc-a"].stop(timeout_s=10) == 0
    # SIGINT (Ctrl-C when run by hand) is a clean stop too.
    osc_b = instances["osc-b"].process
    assert osc_b is not None
    osc_b.send_signal(signal.SIGINT)
    assert osc_b.wait(timeout=10) == 0

    records = read_all_ticks(timers_env)
    a, b = seconds_by_partition(records, "osc-a"), seconds_by_partition(records, "osc-b")
    assert set(a) == set(b) == set(range(PARTITIONS))
    for partition in range(PARTITIONS):
        both_from = max(a[partition][0], b[partition][0])
        both_until = min(a[partition][-1], b[partition][-1])
        assert both_until - both_from >= 2, f"instances overlapped only {both_from}..{both_until}"
        sources_per_second = defaultdict(list)
        for p, _, tick in records:
            if p == partition and both_from <= tick.second <= both_until:
                sources_per_second[tick.second].append(tick.source)
        assert set(sources_per_second) == set(range(both_from, both_until + 1))
        for second, sources in sources_per_second.items():
            assert sorted(sources) == ["osc-a", "osc-b"], (partition, second, sources)


def test_a_missing_topic_is_waited_for_with_the_fix_and_never_created(spawn, broker_env, unique) -> None:
    topics = {
        "TIMERS_TOPIC_OSCILLATOR": unique("late-oscillator"),
        "TIMERS_TOPIC_REQUEST": unique("late-request"),
    }
    port = free_port()
    env = {**broker_env, **topics, "TIMERS_OSC_HEALTH_PORT": str(port)}

    osc = spawn("oscillator", ["-m", "oscillator.main"], env)
    deadline = time.monotonic() + 20
    while "waiting: " not in osc.output():
        assert osc.running and time.monotonic() < deadline, osc.output()
        time.sleep(0.1)
    time.sleep(2.0)  # retries: still up, still one line

    [line] = [line for line in osc.output().splitlines() if "waiting: " in line]
    assert topics["TIMERS_TOPIC_OSCILLATOR"] in line and "timers topics create" in line
    assert get(f"http://127.0.0.1:{port}/healthz")[0] == 200
    status, reason = get(f"http://127.0.0.1:{port}/readyz")
    assert status == 503 and "timers topics create" in reason
    # Looking for the topic must not have created it with the broker's default layout.
    common = CommonConfig.from_env(env)
    listed = admin_client(common.kafka).list_topics(timeout=10).topics
    assert topics["TIMERS_TOPIC_OSCILLATOR"] not in listed

    create_topics(common)
    osc.wait_for_output("oscillator started", timeout_s=20)
    deadline = time.monotonic() + 10
    while get(f"http://127.0.0.1:{port}/readyz")[0] != 200:
        assert time.monotonic() < deadline, "not ready once the topic is there"
        time.sleep(0.2)
    assert osc.stop(timeout_s=10) == 0


def test_after_a_pause_it_resumes_at_the_current_second_without_replaying(spawn, timers_env) -> None:
    port = free_port()
    osc = spawn("oscillator", ["-m", "oscillator.main"], {**timers_env, "TIMERS_OSC_HEALTH_PORT": str(port)})
    osc.wait_for_output("oscillator started", timeout_s=20)
    assert osc.process is not None
    time.sleep(1.5)
    osc.process.send_signal(signal.SIGSTOP)  # as a long GC pause or a frozen VM would
    time.sleep(3.0)
    osc.process.send_signal(signal.SIGCONT)
    time.sleep(1.5)
    assert osc.stop(timeout_s=10) == 0

    records = read_all_ticks(timers_env)
    for partition in range(PARTITIONS):
        ticks = [tick for p, _, tick in records if p == partition]
        seconds = [tick.second for tick in ticks]
        assert seconds == sorted(set(seconds)), f"partition {partition} repeated or reordered: {seconds}"
        gaps = [
            (before, after)
            for before, after in zip(ticks, ticks[1:], strict=False)
            if after.second > before.second + 1
        ]
        assert len(gaps) == 1, f"partition {partition}: expected one gap for the pause, got {seconds}"
        resumed = gaps[0][1]
        # The first tick after the pause is for the second it was sent in, not a stale backlog second.
        assert resumed.second == resumed.emitted_ms // 1000, (resumed.second, resumed.emitted_ms)
