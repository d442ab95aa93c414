"""The task worker on the real broker: hostile records are dead-lettered with their reason, and it goes on."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Producer

from futures.tasks import TaskConfig, TaskRegistry
from futures.tasks.codec import TaskCall
from futures.tasks.worker import MAX_RECORD_BYTES, TaskWorker, ensure_topics
from ktimers.config import CommonConfig
from ktimers.deadletter import H_ORIGINAL_SIZE, H_TRUNCATED
from ktimers.wire import H_ERROR, H_ID, H_REASON, H_SOURCE_OFFSET, header_value
from tests.integration.conftest import Callback, TopicReader
from tests.raw_headers import produce_raw

pytestmark = pytest.mark.integration


def test_hostile_records_are_dead_lettered_and_the_call_after_them_runs(broker_env, unique):
    common = CommonConfig.from_env(broker_env)
    config = TaskConfig(topic=unique("tasks"), dlq=unique("tasks-dlq"), group=unique("tasks"))
    ensure_topics(common, config)
    ran: list[tuple[str, str]] = []
    registry = TaskRegistry(config, common=common)
    registry.register("send-reminder")(lambda user, text: ran.append((user, text)))

    huge_arg = b"x" * (MAX_RECORD_BYTES - 200)  # the record fits; its copy plus our headers would not
    hostile: list[tuple[str, bytes | None, str]] = [
        ("deep", b'{"v":1,"task":"send-reminder","args":' + b"[" * 50_000 + b"]" * 50_000 + b"}", "nested"),
        ("huge-int", b'{"v":1,"task":"send-reminder","args":[' + b"9" * 5000 + b"]}", "4300 digits"),
        ("nan", b'{"v":1,"task":"send-reminder","args":[NaN,"x"]}', "NaN"),
        ("surrogate", b'{"v":1,"task":"send-reminder","args":["\\ud800","x"]}', "surrogates"),
        ("not-utf8", b"\xff\xfe{", "not UTF-8"),
        ("wrong-type", b'{"v":1,"task":["send-reminder"]}', "task name"),
        ("null", None, "null value"),
        ("near-1mb", b'{"v":1,"task":"no-such-task","args":["' + huge_arg + b'"]}', "no-such-task"),
    ]
    producer = Producer({"bootstrap.servers": common.kafka.bootstrap_servers, "message.max.bytes": 2_000_000})
    for name, value, _ in hostile:  # all on partition 0, in order, before the valid call
        producer.produce(config.topic, value, key=name.encode(), partition=0, headers=[(H_ID, name)])
    assert producer.flush(10) == 0
    # A valid call, but with a header key that is not UTF-8: its id and token cannot be read.
    produce_raw(
        common.kafka.bootstrap_servers,
        config.topic,
        [
            (
                0,
                b"raw-header",
                TaskCall("send-reminder", ("mallory", "should not run")).encode(),
                [(b"\xff", b"")],
            )
        ],
    )
    # A valid call with no headers at all runs.
    producer.produce(config.topic, TaskCall("send-reminder", ("u-4", "stand-up")).encode(), partition=0)
    assert producer.flush(10) == 0

    worker = TaskWorker(registry)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop.is_set,), daemon=True)
    thread.start()
    dlq = TopicReader(common.kafka.bootstrap_servers, config.dlq, common.topics.partitions)
    try:
        deadline = time.monotonic() + 60
        while not ran and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        letters = dlq.read_until(lambda r: len(r) >= len(hostile) + 1, timeout_s=20)
    finally:
        stop.set()
        thread.join(30)
        dlq.close()

    assert ran == [("u-4", "stand-up")], "the worker went past every hostile record"
    assert not thread.is_alive()
    by_key = {letter.key: letter for letter in letters}
    assert set(by_key) == {name.encode() for name, _, _ in hostile} | {b"raw-header"}
    for name, value, error in hostile:
        letter = by_key[name.encode()]
        reason = "unknown-task" if name == "near-1mb" else "undecodable"
        assert header(letter, H_REASON) == reason, name
        assert error in header(letter, H_ERROR), name
        assert len(header(letter, H_ERROR)) <= 1000, name
        assert header(letter, H_ID) == name  # the record's own headers are kept
        assert int(header(letter, H_SOURCE_OFFSET)) >= 0
        if name != "near-1mb":
            assert letter.value == value, name  # the record as it was: fix and resend
    big = by_key[b"near-1mb"]
    assert header(big, H_TRUNCATED) == "value"
    assert int(header(big, H_ORIGINAL_SIZE)) > len(hostile[-1][1] or b"")
    assert big.value is not None and (hostile[-1][1] or b"").startswith(big.value)
    unreadable = by_key[b"raw-header"]
    assert header(unreadable, H_REASON) == "undecodable"
    assert "header key is not UTF-8" in header(unreadable, H_ERROR)
    assert worker.runner.dead_counts == {"undecodable": 8, "unknown-task": 1}


def header(record: Callback, name: str) -> str:
    return (header_value(record.headers, name) or b"").decode()
