"""Parsing a `timer-request` record: what it schedules, cancels, or why it is rejected."""

from __future__ import annotations

import pytest

from futures.ingress.limits import ParseLimits
from futures.ingress.records import SourceRecord
from futures.ingress.requests import MAX_ID_BYTES, CancelRequest, Rejection, Schedule, parse_record
from futures.worker.config import WorkerConfig
from futures.worker.table import table_key
from ktimers.config import TopicsConfig
from ktimers.wire import Cancel, Future, Header

NOW_MS = 1_794_999_000_123
SEED_KEY = b"1795000000"
CONFIG = ParseLimits()


def record(
    value: bytes | None,
    key: bytes | None = SEED_KEY,
    *,
    headers: tuple[tuple[str, bytes | None], ...] = (),
    partition: int = 3,
    offset: int = 42,
    topic: str = "timer-request",
) -> SourceRecord:
    return SourceRecord(topic, partition, offset, key, value, headers)


def future(**fields: object) -> bytes:
    fields.setdefault("callBackTopic", "orders")
    return Future(**fields).SerializeToString()  # type: ignore[arg-type]


def parse(rec: SourceRecord, config: ParseLimits = CONFIG) -> Schedule | CancelRequest | Rejection:
    [request] = parse_record(rec, config, NOW_MS)
    return request


def rejected(rec: SourceRecord, config: ParseLimits = CONFIG) -> Rejection:
    result = parse(rec, config)
    assert isinstance(result, Rejection), result
    return result


def test_seed_format_is_due_at_the_key_second_with_a_stable_id():
    # Exactly what a producer of the original design sends: fields 1-3, keyed by the due second.
    seed = Future(callBackTopic="orders", callBackKey="order-7", callBack=b"\x00payload").SerializeToString()
    result = parse(record(seed, partition=3, offset=42))
    assert isinstance(result, Schedule)
    assert result.due_ms == 1_795_000_000_000
    assert result.timer_id == "seed-3-42"
    stored = result.timer
    assert (stored.future.callBackTopic, stored.future.callBackKey, stored.future.callBack) == (
        "orders",
        "order-7",
        b"\x00payload",
    )
    assert (stored.source_partition, stored.source_offset, stored.accepted_ms) == (3, 42, NOW_MS)
    # Re-reading the same record yields the same id, so a replayed seed replaces, not duplicates.
    again = parse(record(seed, partition=3, offset=42))
    assert isinstance(again, Schedule)
    assert again.timer_id == "seed-3-42"


def test_due_ms_field_wins_over_the_key_and_id_is_kept():
    result = parse(record(future(id="order-7", due_ms=1_795_000_000_250), key=b"1700000000"))
    assert isinstance(result, Schedule)
    assert (result.timer_id, result.due_ms) == ("order-7", 1_795_000_000_250)
    # With due_ms the key need not be a number at all.
    keyed = parse(record(future(id="order-7", due_ms=5), key=b"customer-9"))
    assert isinstance(keyed, Schedule)
    assert keyed.due_ms == 5


def test_kind_future_header_is_a_schedule():
    result = parse(record(future(), headers=(("kt-kind", b"future"),)))
    assert isinstance(result, Schedule)


@pytest.mark.parametrize(
    ("rec", "reason"),
    [
        pytest.param(record(b"\x0a\xff"), "undecodable", id="garbage"),
        pytest.param(record(None), "undecodable", id="tombstone"),
        pytest.param(record(future(), key=b"soon"), "bad-due-time", id="key-not-a-number"),
        pytest.param(record(future(), key=None), "bad-due-time", id="no-key"),
        pytest.param(record(future(), key=b"-1795000000"), "bad-due-time", id="negative-key"),
        # Epoch *milliseconds* in the key by mistake would schedule for the year 58000.
        pytest.param(record(future(), key=b"1795000000000"), "bad-due-time", id="key-in-ms"),
        pytest.param(record(future(due_ms=-1)), "bad-due-time", id="negative-due-ms"),
        pytest.param(record(future(callBackTopic="")), "missing-callback-topic", id="no-topic"),
        pytest.param(record(future(callBackTopic="or ders")), "invalid-callback-topic", id="space"),
        pytest.param(record(future(callBackTopic="a" * 250)), "invalid-callback-topic", id="too-long"),
        pytest.param(record(future(callBackTopic="..")), "invalid-callback-topic", id="dotdot"),
        pytest.param(record(future(id="x" * (MAX_ID_BYTES + 1))), "invalid-id", id="id-too-long"),
        pytest.param(record(future(), headers=(("kt-kind", b"delete"),)), "unknown-kind", id="unknown-kind"),
        pytest.param(
            record(Cancel().SerializeToString(), headers=(("kt-kind", b"cancel"),)),
            "missing-id",
            id="cancel-without-id",
        ),
        pytest.param(record(None, headers=(("kt-kind", b"cancel"),)), "missing-id", id="cancel-tombstone"),
        pytest.param(
            record(b"\x0a\xff", headers=(("kt-kind", b"cancel"),)), "undecodable", id="cancel-garbage"
        ),
    ],
)
def test_invalid_requests_are_rejected_with_their_reason(rec, reason):
    result = rejected(rec)
    assert result.reason == reason
    assert result.detail
    assert result.record is rec


def test_rejection_names_the_timer_when_it_has_one():
    assert rejected(record(future(id="order-7", callBackTopic=""))).timer_id == "order-7"
    assert rejected(record(future(callBackTopic=""), partition=1, offset=9)).timer_id == "seed-1-9"


@pytest.mark.parametrize(
    "topic",
    [
        "oscillator",
        "timer-request",
        "timer-events",
        "timer-request-dlq",
        "__consumer_offsets",
        "__transaction_state",
        "timers-timers-changelog",  # the table's own changelog: forging table state
        "timers-anything",
    ],
)
def test_own_and_internal_topics_are_not_callback_targets(topic):
    result = rejected(record(future(callBackTopic=topic)))
    assert result.reason == "callback-topic-not-allowed"


def test_internal_topics_follow_the_configured_names():
    config = ParseLimits(
        topics=TopicsConfig(request="shop-requests", events="shop-events"),
        app_id="shop",
    )
    shop = "shop-requests"
    assert rejected(record(future(callBackTopic="shop-requests"), topic=shop), config).reason == (
        "callback-topic-not-allowed"
    )
    assert rejected(record(future(callBackTopic="shop-timers-changelog"), topic=shop), config).reason == (
        "callback-topic-not-allowed"
    )
    # The default names are ordinary topics for this deployment.
    assert isinstance(parse(record(future(callBackTopic="timer-request"), topic=shop), config), Schedule)
    assert isinstance(parse(record(future(callBackTopic="timers-x"), topic=shop), config), Schedule)


PLATFORM_TOPICS = ["_schemas", "connect-offsets", "orders-changelog", "app-KSTREAM-AGG-0003-repartition"]


def test_platform_internal_topics_are_refused_by_default_unless_the_deny_list_says_otherwise():
    for topic in PLATFORM_TOPICS:
        result = rejected(record(future(callBackTopic=topic)))
        assert result.reason == "callback-topic-not-allowed", topic
        assert "TIMERS_DENIED_CALLBACK_TOPICS" in result.detail, topic
    # An empty deny-list admits them; one of its own refuses only what it lists.
    # (The worker's environment, as the worker turns it into parse limits.)
    admitted = WorkerConfig.from_env({"TIMERS_DENIED_CALLBACK_TOPICS": ""}).parse_limits
    own = WorkerConfig.from_env({"TIMERS_DENIED_CALLBACK_TOPICS": "audit-*"}).parse_limits
    for topic in PLATFORM_TOPICS:
        assert isinstance(parse(record(future(callBackTopic=topic)), admitted), Schedule), topic
        assert isinstance(parse(record(future(callBackTopic=topic)), own), Schedule), topic
    assert rejected(record(future(callBackTopic="audit-log")), own).reason == "callback-topic-not-allowed"
    # Kafka's own internals stay refused whatever the deny-list says.
    assert rejected(record(future(callBackTopic="__consumer_offsets")), admitted).reason == (
        "callback-topic-not-allowed"
    )


def test_allow_list_admits_only_matching_topics():
    config = ParseLimits(allowed_callback_topics=("orders.*", "billing-?"))
    for ok in ("orders.eu", "orders.", "billing-1"):
        assert isinstance(parse(record(future(callBackTopic=ok)), config), Schedule), ok
    for no in ("payments", "ORDERS.eu", "billing-10", "orders"):
        assert rejected(record(future(callBackTopic=no)), config).reason == "callback-topic-not-allowed", no
    # The allow-list never re-admits internal topics.
    internal = ParseLimits(allowed_callback_topics=("*",))
    assert rejected(record(future(callBackTopic="timer-events")), internal).reason == (
        "callback-topic-not-allowed"
    )


def test_topic_with_trailing_newline_is_rejected():
    assert rejected(record(future(callBackTopic="orders\n"))).reason == "invalid-callback-topic"


def stored_size(result: Schedule) -> int:
    """What the changelog record of a timer carries: the stored timer and its table key."""
    return len(result.timer.SerializeToString()) + len(table_key(result.due_ms, result.timer_id))


def test_payload_limit_is_on_the_stored_timer_and_inclusive():
    value = future(callBack=b"x" * 10)
    accepted = parse(record(value))
    assert isinstance(accepted, Schedule)
    size = stored_size(accepted)
    assert isinstance(parse(record(value), ParseLimits(max_payload_bytes=size)), Schedule)
    too_big = rejected(record(value), ParseLimits(max_payload_bytes=size - 1))
    assert too_big.reason == "payload-too-large"
    assert f"stored timer is {size} bytes" in too_big.detail
    assert "(callBack 10 bytes)" in too_big.detail
    assert "TIMERS_MAX_PAYLOAD_BYTES" in too_big.detail


def test_headers_and_id_count_towards_the_payload_limit():
    # A tiny callBack does not make a timer small: everything stored is in the changelog record.
    config = ParseLimits(max_payload_bytes=1000)
    bulky = future(callBack=b"x", headers=[Header(key=f"h{n}", value=b"v" * 100) for n in range(10)])
    assert rejected(record(bulky), config).reason == "payload-too-large"
    long_id = future(callBack=b"x", id="i" * MAX_ID_BYTES, token="t" * 500)
    assert rejected(record(long_id), config).reason == "payload-too-large"


def test_due_ahead_limit():
    config = ParseLimits(max_due_ahead_s=60)
    assert isinstance(parse(record(future(due_ms=NOW_MS + 60_000)), config), Schedule)
    too_far = rejected(record(future(due_ms=NOW_MS + 60_001)), config)
    assert too_far.reason == "due-too-far"
    # 0 means no limit.
    assert isinstance(parse(record(future(due_ms=NOW_MS + 10**12))), Schedule)


def test_cancel_names_the_timer():
    result = parse(record(Cancel(id="order-7").SerializeToString(), headers=(("kt-kind", b"cancel"),)))
    assert isinstance(result, CancelRequest)
    assert result.timer_id == "order-7"


def test_future_keeps_token_and_headers_and_is_normalised():
    value = future(id="order-7", token="tok-1", headers=[Header(key="trace", value=b"abc")], callBack=b"body")
    result = parse(record(value, key=b"1795000001"))
    assert isinstance(result, Schedule)
    f = result.timer.future
    assert (f.id, f.due_ms, f.token) == ("order-7", 1_795_000_001_000, "tok-1")
    assert [(h.key, h.value) for h in f.headers] == [("trace", b"abc")]
    # The stored timer is self-contained: due_ms and id are set even for seed requests.
    seed = parse(record(future()))
    assert isinstance(seed, Schedule)
    assert seed.timer.future.HasField("due_ms")
    assert seed.timer.future.id == "seed-3-42"
