"""Hostile input end to end: a stream of bad records of every kind, interleaved with valid timers.

Every bad record must land in `timer-request-dlq` with its reason (cut down to
fit when it is huge), every valid timer around it must still fire, never early —
those whose Futures carry unknown fields of every wire type (groups, ten-byte
varints) too — and the worker must never stop — also when one of two workers is SIGKILLed in
the middle of the stream. The parsers' verdict on each record is pinned one by
one in tests/ingress/test_hostile.py; here it goes through the real broker,
Faust's consumer (header keys that are not UTF-8), the producer's size limit and
a takeover.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient

from futures.client import TimerClient
from ktimers.config import CommonConfig
from ktimers.deadletter import H_ORIGINAL_SIZE, H_TRUNCATED
from ktimers.topics import create_topics
from ktimers.wire import (
    H_ELEMENT_COUNT,
    H_ERROR,
    H_INVALID_COUNT,
    H_REASON,
    H_SOURCE_INDEX,
    H_SOURCE_OFFSET,
    H_SOURCE_PARTITION,
    H_SOURCE_TOPIC,
    KIND_BATCH,
    KIND_CANCEL,
    KIND_HEADER,
    Cancel,
    Future,
    FutureBatch,
    TimerEvent,
    header_value,
)
from tests.integration.conftest import WORKER_READY, Callback, Stack, TopicReader, fresh_env
from tests.integration.test_scaling import start_second_worker, wait_until_partitions_split
from tests.processes import Service, SpawnFn
from tests.protobuf_bytes import UNKNOWN_FIELDS, varint
from tests.raw_headers import produce_raw

pytestmark = pytest.mark.integration

PARTITIONS = 4
#: Each valid timer is due this long after it is sent (s): the stream around it is read first.
LEAD_S = 4.0
#: Latest a valid timer may arrive after its due time with one healthy worker (ms):
#: the next tick (< 1 s) plus dispatch, on a 2-core machine shared with other jobs.
MAX_LATENESS_MS = 2500
#: Just under librdkafka's and the broker's 1,000,000-byte record limit.
NEAR_LIMIT_BYTES = 990_000
#: The stack's limit on a stored timer; its producer writes records up to this + 16 KiB,
#: so dead letters of the large records below are cut down to fit.
MAX_PAYLOAD_BYTES = 10_000
#: A header key that is not UTF-8, as some clients send.
NOT_UTF8 = b"\xff\xfe-trace"
#: How the dead letter carries it (a producer only takes text).
NOT_UTF8_ESCAPED = "\\xff\\xfe-trace"

Headers = list[tuple[str, bytes]]


@dataclass
class Hostile:
    """One bad record and the dead letter it must become."""

    name: str
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    reason: str
    headers: Headers = field(default_factory=list)
    #: Header keys as raw bytes, sent with :func:`produce_raw` (keys that are not UTF-8).
    raw_headers: list[tuple[bytes, bytes]] | None = None
    #: What ``kt-truncated`` must say, when the dead letter must be cut down.
    truncated: set[str] | None = None
    #: Other headers the dead letter must carry.
    expect: dict[str, bytes] = field(default_factory=dict)
    #: Where the broker put it (topic, partition, offset), once sent by the confluent producer.
    coords: tuple[str, int, int] | None = None

    def original_size(self) -> int:
        """Bytes of key + value + header keys and values as sent: what ``kt-original-size`` must say."""
        return (
            len(self.key or b"")
            + len(self.value or b"")
            + sum(len(k.encode()) + len(v) for k, v in self.headers)
        )

    def is_mine(self, letter: Callback) -> bool:
        if header_value(letter.headers, H_SOURCE_TOPIC) != self.topic.encode():
            return False
        if self.coords is None:  # sent with produce_raw, which does not say where: by its key
            return letter.key == self.key
        return (
            header_value(letter.headers, H_SOURCE_PARTITION) == str(self.coords[1]).encode()
            and header_value(letter.headers, H_SOURCE_OFFSET) == str(self.coords[2]).encode()
        )


@dataclass
class Expected:
    """What the hostile stream must produce: dead letters (by record) and callbacks (by value → due ms)."""

    hostile: list[Hostile] = field(default_factory=list)
    valid: dict[bytes, int] = field(default_factory=dict)
    #: Dead letters that are no record of the stream as sent: the elements of a small bad
    #: batch, by kt-source-index.
    batch_elements: dict[int, str] = field(default_factory=dict)
    batch_record: Hostile | None = None
    #: A timer whose callback topic does not exist (dead-lettered ``callback-undeliverable``): id, due ms.
    nowhere: tuple[str, int] = ("", 0)

    def dead_letter_count(self) -> int:
        return len(self.hostile) + len(self.batch_elements) + 1

    def reasons(self) -> Counter[str]:
        undeliverable = ["callback-undeliverable"]
        return Counter([h.reason for h in self.hostile] + list(self.batch_elements.values()) + undeliverable)


@dataclass
class HostileStack:
    stack: Stack
    etf1: str
    countdown: str
    callbacks: TopicReader
    missing_topic: str

    def dlq(self) -> TopicReader:
        return self.stack.reader(self.stack.common.topics.dlq)


@pytest.fixture
def hostile_stack(broker_env: dict[str, str], spawn: SpawnFn, tmp_path) -> Iterator[HostileStack]:
    """A service instance whose request topics are native, etf1 and countdown; nothing started.

    No callback allow-list, so the default deny-list (``_schemas``, ``connect-*``, ...) is
    what refuses internal topics, and a callback topic that does not exist is allowed.
    """
    settings = {"TIMERS_MAX_PAYLOAD_BYTES": str(MAX_PAYLOAD_BYTES)}
    env = fresh_env(broker_env, partitions=PARTITIONS, settings=settings)
    suffix = uuid.uuid4().hex[:8]
    etf1, countdown = f"schedules-{suffix}", f"delays-{suffix}"
    env["TIMERS_INGRESS_TOPICS"] = f"{etf1}=etf1,{countdown}=countdown"
    create_topics(CommonConfig.from_env(env))
    stack = Stack(env=env, spawn=spawn, data_dir=tmp_path / "worker-data")
    # Before the worker starts: it lists the cluster's topics then, so it knows this one
    # exists and fires into it on the first tick instead of looking it up first.
    callbacks = stack.callback_topic("hostile", PARTITIONS)
    yield HostileStack(stack, etf1, countdown, callbacks, f"cb-missing-{suffix}")
    stack.close()


# -- the stream ----------------------------------------------------------------


def future(topic: str, payload: bytes = b"x", **fields: object) -> bytes:
    return Future(callBackTopic=topic, callBackKey="k", callBack=payload, **fields).SerializeToString()  # type: ignore[arg-type]


def mostly_bad_batch(cb: str, due_ms: int) -> bytes:
    """23 timers, 20 of them bad: one ``batch-invalid`` letter; the 3 good ones (``batch-valid-n``) fire."""
    return FutureBatch(
        futures=[
            *(Future(callBackTopic=cb, callBackKey="k", callBack=b"never") for _ in range(10)),  # no due_ms
            *(
                Future(callBackTopic=cb, callBackKey="k", callBack=f"batch-valid-{i}".encode(), due_ms=due_ms)
                for i in range(3)
            ),
            *(
                Future(callBackTopic="_schemas", callBackKey="k", callBack=b"x", due_ms=due_ms)
                for _ in range(5)
            ),
            *(Future(callBackTopic=cb, callBackKey="k", callBack=b"x", due_ms=-1) for _ in range(5)),
        ]
    ).SerializeToString()


def small_mixed_batch(cb: str, due_ms: int) -> bytes:
    """At most 10 bad timers: each is dead-lettered alone, as a Future with its kt-source-index."""
    return FutureBatch(
        futures=[
            Future(callBackTopic=cb, callBackKey="k", callBack=b"small-batch-valid", due_ms=due_ms),
            Future(callBackTopic=cb, callBackKey="k", callBack=b"x"),  # no due_ms
            Future(callBackTopic="connect-configs", callBackKey="k", callBack=b"x", due_ms=due_ms),
        ]
    ).SerializeToString()


def hostile_records(hs: HostileStack, due_ms: int) -> tuple[list[Hostile], Hostile]:
    """Every class of bad record, spread over the partitions; and the small mixed batch.

    ``due_ms`` is a valid due time for the parts of a record that are not what is wrong with it.
    """
    request, cb = hs.stack.common.topics.request, hs.callbacks.topic
    etf1_headers = [
        ("scheduler-epoch", str(due_ms // 1000).encode()),
        ("scheduler-target-topic", cb.encode()),
        ("scheduler-target-key", b"t"),
    ]
    countdown_head = f'{{"topic": "{cb}", "message": "m", "countdown": '.encode()
    empty_futures = FutureBatch(futures=[Future() for _ in range(50_000)]).SerializeToString()
    mostly_bad = mostly_bad_batch(cb, due_ms)
    big_id = "i" * 100_000
    batch = [(KIND_HEADER, KIND_BATCH)]
    records = [
        Hostile("undecodable", request, 0, b"h-undecodable", b"\xff\xfe not protobuf", "undecodable"),
        Hostile(
            "near-limit",
            request,
            1,
            b"h-near-limit",
            b"\xff" * NEAR_LIMIT_BYTES,
            "undecodable",
            truncated={"value"},
        ),
        Hostile(
            "after-9999", request, 2, b"h-after-9999", future(cb, due_ms=253_402_300_800_000), "bad-due-time"
        ),
        Hostile("int64-max", request, 3, b"h-int64-max", future(cb, due_ms=2**63 - 1), "bad-due-time"),
        Hostile("negative-due", request, 0, b"h-negative", future(cb, due_ms=-1_000), "bad-due-time"),
        Hostile(
            "cancel-100kB-id",
            request,
            1,
            big_id.encode(),
            Cancel(id=big_id).SerializeToString(),
            "invalid-id",
            headers=[(KIND_HEADER, KIND_CANCEL)],
            truncated={"key", "value"},
        ),
        Hostile("600-byte-id", request, 2, b"h-600", future(cb, id="x" * 600, due_ms=due_ms), "invalid-id"),
        Hostile(
            "huge-key-bare-future",
            request,
            3,
            b"k\xff" * 50_000,
            future(cb),
            "bad-due-time",
            truncated={"key"},
        ),
        Hostile(
            "unknown-kind",
            request,
            0,
            b"h-kind",
            future(cb, due_ms=due_ms),
            "unknown-kind",
            headers=[(KIND_HEADER, b"snooze")],
        ),
        Hostile("empty-batch", request, 1, b"h-empty-batch", b"", "empty-batch", headers=batch),
        Hostile(
            "50k-empty-futures",
            request,
            2,
            b"h-50k",
            empty_futures,
            "batch-invalid",
            headers=batch,
            truncated={"value"},
            expect={H_INVALID_COUNT: b"50000", H_ELEMENT_COUNT: b"50000"},
        ),
        Hostile(
            # Headers too large to copy whole: the letter is cut, and must keep its counts.
            "bad-batch-big-headers",
            request,
            3,
            b"h-big-headers",
            FutureBatch(futures=[Future() for _ in range(20)]).SerializeToString(),
            "batch-invalid",
            headers=[*batch, *((f"trace-{i}", b"t" * 1000) for i in range(30))],
            truncated={"headers"},
            expect={H_INVALID_COUNT: b"20", H_ELEMENT_COUNT: b"20"},
        ),
        Hostile(
            "mostly-bad-batch",
            request,
            3,
            b"h-mostly-bad",
            mostly_bad,
            "batch-invalid",
            headers=batch,
            expect={H_INVALID_COUNT: b"20", H_ELEMENT_COUNT: b"23"},
        ),
        Hostile(
            "schemas",
            request,
            0,
            b"h-schemas",
            future("_schemas", due_ms=due_ms),
            "callback-topic-not-allowed",
        ),
        Hostile(
            "consumer-offsets",
            request,
            1,
            b"h-dunder",
            future("__consumer_offsets", due_ms=due_ms),
            "callback-topic-not-allowed",
        ),
        Hostile(
            "connect",
            request,
            2,
            b"h-connect",
            future("connect-offsets", due_ms=due_ms),
            "callback-topic-not-allowed",
        ),
        Hostile(
            "changelog",
            request,
            3,
            b"h-changelog",
            future("orders-changelog", due_ms=due_ms),
            "callback-topic-not-allowed",
        ),
        Hostile(
            "own-request-topic",
            request,
            0,
            b"h-own",
            future(request, due_ms=due_ms),
            "callback-topic-not-allowed",
        ),
        Hostile(
            "timer-request-not-utf8-header-kind",
            request,
            1,
            b"h-raw-kind",
            future(cb, due_ms=due_ms),
            "unknown-kind",
            raw_headers=[(NOT_UTF8, b"1"), (b"kt-kind", b"\xff")],
        ),
        Hostile("cd-1e400", hs.countdown, 0, b"cd-1e400", countdown_head + b"1e400}", "bad-due-time"),
        Hostile(
            "cd-4000-digits", hs.countdown, 1, b"cd-4000", countdown_head + b"9" * 4000 + b"}", "bad-due-time"
        ),
        # More digits than Python converts to an int: json.loads itself refuses the document.
        Hostile(
            "cd-5000-digits", hs.countdown, 2, b"cd-5000", countdown_head + b"9" * 5000 + b"}", "undecodable"
        ),
        Hostile(
            "cd-deep-nesting",
            hs.countdown,
            3,
            b"cd-nesting",
            b"[" * 100_000,
            "undecodable",
            truncated={"value"},
        ),
        Hostile(
            "cd-lone-surrogate",
            hs.countdown,
            0,
            b"cd-surrogate",
            json.dumps({"topic": "\ud800", "message": "m", "countdown": 1}).encode(),
            "invalid-field",
        ),
        Hostile(
            "cd-schemas",
            hs.countdown,
            1,
            b"cd-schemas",
            json.dumps({"topic": "_schemas", "message": "m", "countdown": 1}).encode(),
            "callback-topic-not-allowed",
        ),
        Hostile(
            "etf1-no-epoch", hs.etf1, 2, b"etf1-no-epoch", b"x", "missing-header", headers=etf1_headers[1:]
        ),
        Hostile(
            "etf1-not-utf8-header",
            hs.etf1,
            3,
            b"etf1-bad-header",
            b"x",
            "invalid-header",
            raw_headers=[(k.encode(), v) for k, v in etf1_headers] + [(NOT_UTF8, b"v")],
        ),
    ]
    # Not dead-lettered as a whole (no reason of its own): its bad timers are, one by one.
    small_batch = Hostile(
        "small-mixed-batch", request, 2, b"h-small-batch", small_mixed_batch(cb, due_ms), "", headers=batch
    )
    return records, small_batch


class Sender:
    """Sends the stream: valid timers through the client, bad records as a foreign producer would."""

    def __init__(self, hs: HostileStack) -> None:
        self.hs = hs
        self.client = TimerClient(hs.stack.common)
        self.producer = Producer({"bootstrap.servers": hs.stack.bootstrap})
        self.expected = Expected()
        self._step = 0
        self.bad_ticks = 0

    def valid(self) -> None:
        """A valid native timer, due LEAD_S (+ up to 0.9 s) from now, keyed by a random id."""
        name = f"valid-{self._step}"
        handle = self.client.schedule(
            self.hs.callbacks.topic, name, name, delay=LEAD_S + (self._step % 10) / 10
        )
        self.client.flush(10)
        self.expected.valid[name.encode()] = handle.due_ms
        self._step += 1

    def send(self, record: Hostile, *, valid_parts: dict[bytes, int] | None = None) -> None:
        if record.raw_headers is not None:
            produce_raw(
                self.hs.stack.bootstrap,
                record.topic,
                [(record.partition, record.key, record.value, record.raw_headers)],
            )
        else:
            record.coords = self._produce(
                record.topic, record.partition, record.key, record.value, record.headers
            )
        if record.reason:
            self.expected.hostile.append(record)
        self.expected.valid.update(valid_parts or {})

    def _produce(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        timestamp_ms: int = 0,
    ) -> tuple[str, int, int]:
        landed: list[Message] = []
        errors: list[KafkaError] = []

        def report(err: KafkaError | None, msg: Message) -> None:
            (errors if err else landed).append(err or msg)  # type: ignore[arg-type]

        kafka_headers: list[tuple[str, str | bytes | None]] = list(headers)
        self.producer.produce(
            topic,
            value,
            key,
            partition=partition,
            headers=kafka_headers or None,
            timestamp=timestamp_ms,
            on_delivery=report,
        )
        assert self.producer.flush(10) == 0 and not errors, errors
        [msg] = landed
        return topic, partition, msg.offset() or 0

    def valid_etf1_and_countdown(self) -> None:
        """One valid timer on each foreign ingress topic: they keep flowing around the bad ones."""
        cb = self.hs.callbacks.topic
        due_s = int(time.time() + LEAD_S) + 1
        headers = [
            ("scheduler-epoch", str(due_s).encode()),
            ("scheduler-target-topic", cb.encode()),
            ("scheduler-target-key", b"etf1"),
        ]
        self._produce(self.hs.etf1, 1, b"etf1-valid", b"etf1-valid", headers)
        self.expected.valid[b"etf1-valid"] = due_s * 1000
        sent_ms = int(time.time() * 1000)
        body = json.dumps({"topic": cb, "message": "countdown-valid", "countdown": LEAD_S}).encode()
        self._produce(self.hs.countdown, 2, b"countdown-valid", body, [], timestamp_ms=sent_ms)
        self.expected.valid[b"countdown-valid"] = sent_ms + int(LEAD_S * 1000)

    def valid_behind_a_bad_header_key(self) -> None:
        """A valid Future on timer-request whose record has a header key that is not UTF-8.

        The native format reads only ``kt-kind``, so the record is a Future and is scheduled.
        """
        due_ms = int((time.time() + LEAD_S) * 1000)
        value = future(
            self.hs.callbacks.topic, b"valid-not-utf8-header", id="valid-not-utf8-header", due_ms=due_ms
        )
        produce_raw(
            self.hs.stack.bootstrap,
            self.hs.stack.common.topics.request,
            [(3, b"h-raw-valid", value, [(NOT_UTF8, b"1")])],
        )
        self.expected.valid[b"valid-not-utf8-header"] = due_ms

    def valid_with_unknown_fields(self) -> None:
        """Futures as producers of other languages or newer schemas write them, which protobuf
        reads and the worker stores as read: unknown fields of every wire type (a group, a
        ten-byte varint …), one a record and all in one batch. Each must fire as sent."""
        cb, request = self.hs.callbacks.topic, self.hs.stack.common.topics.request
        due_ms = int((time.time() + LEAD_S) * 1000)
        batched: list[bytes] = []
        for n, (kind, extra) in enumerate(UNKNOWN_FIELDS.items()):
            for way in ("record", "batched"):
                name = f"unknown-fields-{way}-{kind}"
                value = extra + future(cb, name.encode(), id=name, due_ms=due_ms) + extra
                if way == "record":
                    self._produce(request, n % PARTITIONS, name.encode(), value, [])
                else:
                    batched.append(value)
                self.expected.valid[name.encode()] = due_ms
        batch = b"".join(b"\x0a" + varint(len(v)) + v for v in batched)
        self._produce(request, 1, b"unknown-fields-batch", batch, [(KIND_HEADER, KIND_BATCH)])

    def bad_tick(self) -> None:
        """A record on the oscillator topic whose header key is not UTF-8 and whose key is no second.

        The worker's tick consumer must read past it (futures/worker/fetch.py) and count it as an
        invalid tick; the valid timers around it keep firing on the oscillator's ticks.
        """
        oscillator = self.hs.stack.common.topics.oscillator
        produce_raw(self.hs.stack.bootstrap, oscillator, [(0, b"not-a-second", b"", [(NOT_UTF8, b"1")])])
        self.bad_ticks += 1

    def nowhere(self) -> None:
        """A timer to a callback topic that does not exist (see :func:`check_nowhere`)."""
        handle = self.client.schedule(self.hs.missing_topic, "k", b"nowhere", delay=LEAD_S)
        self.client.flush(10)
        self.expected.nowhere = (handle.id, handle.due_ms)

    def stream(self, records: list[Hostile], small_batch: Hostile, *, halves: bool = False) -> Iterator[None]:
        """Send everything, a valid timer between any two bad records; yields halfway when ``halves``."""
        cb = self.hs.callbacks.topic
        self.valid_etf1_and_countdown()
        self.nowhere()
        for i, record in enumerate(records):
            self.valid()
            if record.name == "mostly-bad-batch":
                # Its good timers are due LEAD_S from now, like every valid timer.
                due_ms = int((time.time() + LEAD_S) * 1000)
                record.value = mostly_bad_batch(cb, due_ms)
                self.send(record, valid_parts={f"batch-valid-{n}".encode(): due_ms for n in range(3)})
            else:
                self.send(record)
            if i == 3:
                self.valid_behind_a_bad_header_key()
                self.bad_tick()
            if i == 5:
                self.valid_with_unknown_fields()
            if i == 8:
                due_ms = int((time.time() + LEAD_S) * 1000)
                small_batch.value = small_mixed_batch(cb, due_ms)
                self.send(small_batch, valid_parts={b"small-batch-valid": due_ms})
                self.expected.batch_record = small_batch
                self.expected.batch_elements = {1: "bad-due-time", 2: "callback-topic-not-allowed"}
            if halves and i == len(records) // 2:
                yield
        self.valid()

    def close(self) -> None:
        self.client.close(10)
        self.producer.flush(10)


# -- checks --------------------------------------------------------------------


def reason(letter: Callback) -> str:
    return (header_value(letter.headers, H_REASON) or b"").decode()


def read_dead_letters(reader: TopicReader, expected: Expected, timeout_s: float) -> list[Callback]:
    """Read the DLQ until every expected dead letter is there (or ``timeout_s``); then a little more."""

    def complete(letters: list[Callback]) -> bool:
        return not missing_letters(letters, expected)

    reader.read_until(complete, timeout_s=timeout_s)
    reader.poll(1.0)  # repeats, a flood of per-element letters, would show now
    return reader.records


def missing_letters(letters: list[Callback], expected: Expected) -> list[str]:
    missing = [h.name for h in expected.hostile if not any(h.is_mine(d) for d in letters)]
    batch = expected.batch_record
    assert batch is not None
    indexes = {header_value(d.headers, H_SOURCE_INDEX) for d in letters if batch.is_mine(d)}
    missing += [f"small-batch[{i}]" for i in expected.batch_elements if str(i).encode() not in indexes]
    return missing


def letter_problems(letters: list[Callback], expected: Expected) -> tuple[dict[str, int], list[str]]:
    """How many letters each bad record got, and what is wrong with any of them (all of it, not the first).

    Each must carry its reason, a short ``kt-error``, the record as sent — or, when that
    does not fit the producer, cut down with ``kt-truncated`` and ``kt-original-size``.
    """
    missing = missing_letters(letters, expected)
    assert not missing, f"never dead-lettered: {missing}; got {sorted(reason(d) for d in letters)}"
    copies: dict[str, int] = {}
    problems: list[str] = []

    def check(ok: bool, problem: str) -> None:
        if not ok:
            problems.append(problem)

    for h in expected.hostile:
        mine = [d for d in letters if h.is_mine(d)]
        copies[h.name] = len(mine)
        for letter in mine:
            detail = (header_value(letter.headers, H_ERROR) or b"").decode()
            check(reason(letter) == h.reason, f"{h.name}: reason {reason(letter)} ({detail}), not {h.reason}")
            check(0 < len(detail) <= 400, f"{h.name}: kt-error of {len(detail)} characters")
            for name, value in h.expect.items():
                got = header_value(letter.headers, name)
                check(got == value, f"{h.name}: {name}={got!r}, not {value!r}")
            cut = header_value(letter.headers, H_TRUNCATED)
            key, value = letter.key or b"", letter.value or b""
            if h.truncated is None:
                check(cut is None, f"{h.name}: cut ({cut!r}) though it fits")
                check((letter.key, letter.value) == (h.key, h.value), f"{h.name}: not as it was sent")
            else:
                what = set((cut or b"").decode().split(","))
                check(what == h.truncated, f"{h.name}: kt-truncated={cut!r}, expected {sorted(h.truncated)}")
                original = header_value(letter.headers, H_ORIGINAL_SIZE)
                check(
                    original == str(h.original_size()).encode(),
                    f"{h.name}: kt-original-size={original!r}, sent with {h.original_size()} bytes",
                )
                check(
                    value == (h.value or b"")[: len(value)], f"{h.name}: value not a prefix of the sent one"
                )
                check(key == (h.key or b"")[: len(key)], f"{h.name}: key not a prefix of the sent one")
                check(len(key) + len(value) < MAX_PAYLOAD_BYTES + 16 * 1024, f"{h.name}: not cut to size")
            if h.raw_headers is not None:
                # The key that was not UTF-8 comes back as escaped text.
                escaped = (NOT_UTF8_ESCAPED, dict(h.raw_headers)[NOT_UTF8])
                check(escaped in letter.headers, f"{h.name}: no {escaped} header")
    for name in ("schemas", "connect", "changelog", "cd-schemas"):
        [h] = [h for h in expected.hostile if h.name == name]
        detail = (header_value(next(d for d in letters if h.is_mine(d)).headers, H_ERROR) or b"").decode()
        check(
            "TIMERS_DENIED_CALLBACK_TOPICS" in detail, f"{name}: refused, but not by the deny-list: {detail}"
        )
    batch = expected.batch_record
    assert batch is not None
    for letter in (d for d in letters if batch.is_mine(d)):
        index = int(header_value(letter.headers, H_SOURCE_INDEX) or b"-1")
        check(index in expected.batch_elements, f"small batch: a letter for index {index}: {reason(letter)}")
        check(reason(letter) == expected.batch_elements.get(index), f"small batch[{index}]: {reason(letter)}")
        check(
            Future.FromString(letter.value or b"").callBackTopic != "",
            f"small batch[{index}]: not resendable",
        )
    return copies, problems


def check_fired(callbacks: list[Callback], expected: Expected, *, on_time: bool) -> Counter[bytes]:
    """Every valid timer fired, never early (by our clock and the worker's); on time if ``on_time``."""
    counts = Counter(c.value or b"" for c in callbacks)
    missing = set(expected.valid) - set(counts)
    assert not missing, f"{len(missing)} valid timers never fired: {sorted(missing)}"
    extra = set(counts) - set(expected.valid)
    assert not extra, f"callbacks of timers that were refused: {sorted(extra)}"
    for c in callbacks:
        due = expected.valid[c.value or b""]
        assert c.due_ms == due, (c.value, c.due_ms, due)
        assert c.fired_ms >= due and c.received_ms >= due, f"{c.value!r} fired early: {c}"
        if on_time:
            assert c.received_ms - due <= MAX_LATENESS_MS, f"{c.value!r} {c.received_ms - due} ms late"
    return counts


def check_nowhere(hs: HostileStack, dlq: TopicReader, expected: Expected, *, once: bool) -> None:
    """The timer whose callback topic did not exist: dead-lettered, and the topic never created.

    The worker looks a callback topic it does not know up when a timer for it is accepted,
    and keeps a timer for a topic not looked up yet for the next tick meanwhile
    (futures/worker/destinations.py), so it holds no other timer back (check_fired saw them
    on time). The lookup lists the cluster's topics, so it creates none, even on a broker that
    creates topics on first use (the embedded broker, and Kafka's default): the timer is
    dead-lettered ``callback-undeliverable``, to be resent once the topic exists.
    """
    timer_id, _ = expected.nowhere
    dlq.read_until(lambda r: any(d.key == timer_id.encode() for d in r), timeout_s=20)
    letters = [d for d in dlq.records if d.key == timer_id.encode()]
    assert {reason(d) for d in letters} == {"callback-undeliverable"}
    assert not once or len(letters) == 1
    admin = AdminClient({"bootstrap.servers": hs.stack.bootstrap})
    topics = admin.list_topics(timeout=5).topics  # all topics: this lookup creates none
    assert hs.missing_topic not in topics, "the worker created a callback topic a request named"


def rejected_by_reason(stack: Stack, port: int | None = None) -> Counter[str]:
    if port is not None:
        stack = Stack(env=stack.env, spawn=stack.spawn, data_dir=stack.data_dir, web_port=port)
    counts: Counter[str] = Counter()
    for name, value in stack.metrics().items():
        match = re.fullmatch(r'timers_rejected_total\{reason="([a-z-]+)"\}', name)
        if match:
            counts[match[1]] = int(value)
    return counts


def assert_never_stopped(service: Service) -> None:
    assert service.running, f"{service.name} exited:\n{service.output()[-4000:]}"
    assert "stopping the worker" not in service.output(), service.output()[-4000:]


# -- tests ---------------------------------------------------------------------


def test_hostile_stream_is_dead_lettered_and_valid_timers_fire_on_time(hostile_stack: HostileStack) -> None:
    hs, stack = hostile_stack, hostile_stack.stack
    stack.start_worker()
    stack.start_oscillator()
    due_ms = int((time.time() + LEAD_S + 2) * 1000)
    records, small_batch = hostile_records(hs, due_ms)
    sender = Sender(hs)
    started = time.monotonic()
    for _ in sender.stream(records, small_batch):
        pass
    sender.close()
    expected = sender.expected
    print(f"\nsent {len(expected.hostile) + 1} bad records, {len(expected.valid)} valid timers in "
          f"{time.monotonic() - started:.1f}s")  # fmt: skip

    dlq = hs.dlq()
    letters = read_dead_letters(dlq, expected, timeout_s=30)
    copies, problems = letter_problems(letters, expected)
    # One healthy worker: each bad record once, and a batch of 50,000 bad timers is one letter.
    assert set(copies.values()) == {1}, copies

    hs.callbacks.read_until(lambda r: len(r) >= len(expected.valid), timeout_s=20)
    hs.callbacks.poll(1.5)  # a timer fired twice would show now
    counts = check_fired(hs.callbacks.records, expected, on_time=True)
    assert set(counts.values()) == {1}, {v: n for v, n in counts.items() if n > 1}
    check_nowhere(hs, dlq, expected, once=True)
    assert len(dlq.records) == expected.dead_letter_count(), Counter(reason(d) for d in dlq.records)

    assert rejected_by_reason(stack) == expected.reasons()
    assert stack.metrics().get('timers_ticks_total{outcome="invalid"}') == sender.bad_ticks == 1
    rejected_events = [e for e in stack.events() if e.kind == TimerEvent.Kind.REJECTED]
    assert len(rejected_events) == expected.dead_letter_count()
    assert stack.worker is not None
    assert_never_stopped(stack.worker)
    assert not problems, "dead letters not as they must be:\n" + "\n".join(problems)


def test_hostile_stream_survives_a_sigkill_of_one_of_two_workers(hostile_stack: HostileStack) -> None:
    hs, stack = hostile_stack, hostile_stack.stack
    stack.start_worker()
    stack.start_oscillator()
    second, second_port = start_second_worker(stack)
    held = wait_until_partitions_split([stack.web_port, second_port], PARTITIONS, timeout_s=60)
    assert all(held), f"one worker holds nothing: {held}"

    due_ms = int((time.time() + LEAD_S + 2) * 1000)
    records, small_batch = hostile_records(hs, due_ms)
    sender = Sender(hs)
    dlq = hs.dlq()
    stream = sender.stream(records, small_batch, halves=True)
    next(stream)
    # Both workers are at work on the stream: kill one of them in the middle of it.
    dlq.read_until(lambda r: len(r) >= 3, timeout_s=15)
    second.kill()
    killed_at = time.monotonic()
    for _ in stream:
        pass
    sender.close()
    expected = sender.expected
    wait_until_partitions_split([stack.web_port], PARTITIONS, timeout_s=30)
    took_over_s = time.monotonic() - killed_at
    # And back: the killed worker restarts and takes its share again.
    second.start()
    second.wait_for_output(WORKER_READY, timeout_s=60)

    letters = read_dead_letters(dlq, expected, timeout_s=30)
    copies, problems = letter_problems(letters, expected)
    # At least once: a letter written just before the kill may be written again by the
    # new owner, which reads the record again — but never more than once more.
    assert max(copies.values()) <= 2, copies

    hs.callbacks.read_until(lambda r: set(expected.valid) <= {c.value for c in r}, timeout_s=30)
    hs.callbacks.poll(1.0)
    counts = check_fired(hs.callbacks.records, expected, on_time=False)
    check_nowhere(hs, dlq, expected, once=False)
    late_s = max(c.received_ms - expected.valid[c.value or b""] for c in hs.callbacks.records) / 1000
    print(
        f"\ntakeover {took_over_s:.1f}s; {len(letters)} dead letters for {expected.dead_letter_count()} "
        f"expected; {sum(counts.values()) - len(counts)} repeated callbacks; latest {late_s:.1f}s late"
    )
    wait_until_partitions_split([stack.web_port, second_port], PARTITIONS, timeout_s=30)
    # Whatever each live worker rejected, it rejected for a reason of the stream: none of them broke.
    assert set(rejected_by_reason(stack) + rejected_by_reason(stack, second_port)) <= set(expected.reasons())
    assert stack.worker is not None
    assert_never_stopped(stack.worker)
    assert second.running, second.output()[-4000:]
    assert "stopping the worker" not in second.current_output(), second.current_output()[-4000:]
    assert not problems, "dead letters not as they must be:\n" + "\n".join(problems)
