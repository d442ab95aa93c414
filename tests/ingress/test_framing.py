"""Requests in the Confluent Schema Registry wire format, as confluent-kafka's ProtobufSerializer writes them.

The producer side is confluent-kafka's own serializer (with its in-memory
``mock://`` registry), not an encoder of ours: what a team's producer sends is
what these tests parse.
"""

from __future__ import annotations

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf.message import Message
from hypothesis import given
from hypothesis import strategies as st

from futures.ingress.base import PARSE_REASONS
from futures.ingress.framing import REQUEST_KINDS, Framed, unframe
from futures.ingress.native import fast_parse
from futures.ingress.requests import CancelRequest, Rejection, RequestParser, Schedule
from ktimers.wire import KIND_BATCH, KIND_CANCEL, KIND_FUTURE, Cancel, Future, FutureBatch, Header, Tick
from tests.ingress.fuzzing import FUZZ, mutated
from tests.ingress.helpers import CONFIG, NOW_MS, parse, record, rejected, scheduled

REQUEST = "timer-request"
DUE_MS = 1_795_000_000_000


def serialized(message: Message, registry: SchemaRegistryClient | None = None, topic: str = REQUEST) -> bytes:
    """``message`` as a producer using confluent-kafka's ProtobufSerializer sends it to ``topic``."""
    registry = registry or SchemaRegistryClient.new_client({"url": "mock://framing"})
    serializer = ProtobufSerializer(type(message), registry, {})
    value = serializer(message, SerializationContext(topic, MessageField.VALUE))
    assert value is not None
    return value


def test_the_message_index_of_each_request_is_its_place_in_timers_proto():
    # Future is the first message of the file, Header the second, FutureBatch the third, Cancel the fourth.
    assert REQUEST_KINDS == {(0,): KIND_FUTURE, (2,): KIND_BATCH, (3,): KIND_CANCEL}


def test_the_serializers_framing_is_taken_apart():
    future = Future(callBackTopic="cb-orders", id="a", due_ms=DUE_MS)
    value = serialized(future)
    assert value[:6] == b"\x00\x00\x00\x00\x01\x00"  # magic, schema id 1, the [0] shortcut
    framed = unframe(value)
    assert framed == Framed(1, (0,), future.SerializeToString())
    assert unframe(serialized(Cancel(id="a"))) == Framed(1, (3,), Cancel(id="a").SerializeToString())


def test_a_framed_future_from_the_serializer_is_scheduled_as_a_bare_one_would_be():
    future = Future(callBackTopic="cb-orders", callBackKey="o-1", callBack=b"\x00pay", id="t-1")
    future.due_ms = DUE_MS
    future.headers.append(Header(key="trace", value=b"abc"))
    framed = scheduled(record(REQUEST, serialized(future)))
    bare = scheduled(record(REQUEST, future.SerializeToString()))
    assert framed.timer == bare.timer
    assert (framed.timer_id, framed.due_ms, framed.timer.future.callBack) == ("t-1", DUE_MS, b"\x00pay")


def test_a_framed_seed_future_takes_its_due_second_from_the_key():
    seed = serialized(Future(callBackTopic="cb-orders", callBack=b"x"))
    result = scheduled(record(REQUEST, seed, b"1795000000"))
    assert (result.timer_id, result.due_ms) == ("seed-2-17", DUE_MS)


def test_the_message_index_decides_the_kind_whatever_kt_kind_says():
    cancel = serialized(Cancel(id="t-1"))
    [result] = parse(record(REQUEST, cancel, headers=(("kt-kind", b"future"),)))
    assert result == CancelRequest(record(REQUEST, cancel, headers=(("kt-kind", b"future"),)), "t-1")
    assert isinstance(parse(record(REQUEST, cancel))[0], CancelRequest)  # no kt-kind needed


def test_a_framed_batch_schedules_every_timer_and_dead_letters_a_bad_one_alone():
    batch = FutureBatch(
        futures=[
            Future(callBackTopic="cb-a", id="a", due_ms=DUE_MS),
            Future(callBackTopic="elsewhere", id="b", due_ms=DUE_MS),
            Future(callBackTopic="cb-c", due_ms=DUE_MS),
        ]
    )
    results = parse(record(REQUEST, serialized(batch)))
    assert [r.timer_id for r in results if isinstance(r, Schedule)] == ["a", "seed-2-17-2"]
    [bad] = [r for r in results if isinstance(r, Rejection)]
    assert (bad.reason, bad.timer_id) == ("callback-topic-not-allowed", "b")
    # The bad timer is dead-lettered as the bare single Future that would have requested it.
    assert Future.FromString(bad.record.value or b"").callBackTopic == "elsewhere"


def test_a_message_that_is_no_timer_request_is_dead_lettered_with_its_index():
    rejection = rejected(record(REQUEST, serialized(Tick(second=5))))
    assert rejection.reason == "unknown-message-index"
    assert "message index [4]" in rejection.detail and "Future is [0]" in rejection.detail
    # Nested message indexes, and arrays too long to be any of ours.
    for indexes in (b"\x04\x00\x02", b"\x7e" + b"\x00" * 63):
        rejection = rejected(record(REQUEST, b"\x00\x00\x00\x00\x07" + indexes + b"\x0a\x01a"))
        assert rejection.reason == "unknown-message-index", indexes


@pytest.mark.parametrize(
    ("value", "detail"),
    [
        (b"\x00", "1 bytes"),
        (b"\x00\x00\x00\x00\x01", "5 bytes"),
        (b"\x00\x00\x00\x00\x01\x80", "length is not a varint"),
        (b"\x00\x00\x00\x00\x01\x01", "negative"),
        (b"\x00\x00\x00\x00\x01\x04\x02", "message index 1 of 2 is not a varint"),
        (b"\x00\x00\x00\x00\x01" + b"\xff" * 11, "length is not a varint"),
    ],
)
def test_broken_framing_is_undecodable_and_says_why(value, detail):
    rejection = rejected(record(REQUEST, value))
    assert rejection.reason == "undecodable"
    assert detail in rejection.detail and "Schema Registry framing" in rejection.detail


def test_a_framed_message_that_does_not_decode_is_undecodable():
    assert rejected(record(REQUEST, b"\x00\x00\x00\x00\x01\x00\xff\xff")).reason == "undecodable"


def test_the_fast_path_leaves_framed_records_to_the_parser():
    context = RequestParser(CONFIG, NOW_MS).context
    value = serialized(Future(callBackTopic="cb-orders", id="a", due_ms=DUE_MS))
    assert fast_parse(None, value, context) is None
    assert fast_parse(KIND_CANCEL, serialized(Cancel(id="a")), context) is None


# -- fuzzing ------------------------------------------------------------------

FRAMED_REASONS = PARSE_REASONS - {"internal-error", "unknown-topic", "schema-rejected"}
GOOD = st.sampled_from(
    [
        serialized(Future(callBackTopic="cb-x", id="a", due_ms=DUE_MS)),
        serialized(Cancel(id="a")),
        serialized(FutureBatch(futures=[Future(callBackTopic="cb-x", id="a", due_ms=DUE_MS)])),
    ]
)
FRAMED = st.one_of(
    mutated(GOOD).map(lambda v: b"\x00" + v[1:] if v else b"\x00"),
    st.binary(max_size=40).map(lambda b: b"\x00" + b),
)


@FUZZ
@given(FRAMED)
def test_unframe_takes_any_bytes_apart_or_says_why_not(value):
    framed = unframe(value)
    if isinstance(framed, str):
        assert framed
    else:
        assert 0 <= framed.schema_id < 2**32
        assert framed.indexes or framed.count > 8


@FUZZ
@given(FRAMED, st.sampled_from([(), (("kt-kind", b"cancel"),), (("kt-kind", b"batch"),)]))
def test_framed_records_of_any_bytes_give_requests_or_a_clear_rejection(value, headers):
    for result in parse(record(REQUEST, value, b"1795000000", headers=headers)):
        if isinstance(result, Rejection):
            assert result.reason in FRAMED_REASONS | {"batch-invalid"}, result
            assert result.detail
        else:
            assert isinstance(result, Schedule | CancelRequest)
