"""Checking framed requests' schema ids against a Schema Registry: compatibility, caching, a slow registry."""

from __future__ import annotations

import base64
import time
from dataclasses import replace
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.error import SchemaRegistryError
from google.protobuf import descriptor_pb2

from futures.ingress.limits import ParseLimits
from futures.ingress.registry import UNAVAILABLE_FOR_S, UNKNOWN_RETRY_S, SchemaCheck
from futures.ingress.requests import CancelRequest, Schedule
from futures.worker.config import WorkerConfig
from futures.worker.schemas import SchemaRegistryConfig
from ktimers.errors import ConfigError
from ktimers.wire import Cancel, Future, FutureBatch
from tests.ingress.helpers import CONFIG, parse, record, rejected
from tests.ingress.registry_stub import registry_stub, timers_proto
from tests.ingress.test_framing import serialized

REQUEST = "timer-request"
DUE_MS = 1_795_000_000_000
FUTURE = Future(callBackTopic="cb-orders", id="t-1", due_ms=DUE_MS).SerializeToString()
T = descriptor_pb2.FieldDescriptorProto


def framed(schema_id: int, index: int, message: bytes) -> bytes:
    """What ProtobufSerializer writes for a top-level message ``index`` of schema ``schema_id``."""
    indexes = b"\x00" if index == 0 else bytes([2, index * 2])
    return b"\x00" + schema_id.to_bytes(4, "big") + indexes + message


class Source:
    """A registry client that holds a few schemas, counts lookups, and can be made to fail."""

    def __init__(self) -> None:
        self.schemas: dict[int, Any] = {}
        self.lookups: list[int] = []
        self.failure: Exception | None = None

    def add(self, schema_id: int, proto: descriptor_pb2.FileDescriptorProto, schema_type: str = "PROTOBUF"):
        text = base64.b64encode(proto.SerializeToString()).decode()
        self.schemas[schema_id] = Schema(text, schema_type)

    def get_schema(self, schema_id, subject_name=None, fmt=None, reference_format=None):
        assert fmt == "serialized"
        self.lookups.append(schema_id)
        if self.failure is not None:
            raise self.failure
        if schema_id not in self.schemas:
            raise SchemaRegistryError(404, 40403, "Schema not found")
        return self.schemas[schema_id]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def source() -> Source:
    source = Source()
    source.add(7, timers_proto())
    return source


@pytest.fixture
def clock() -> Clock:
    return Clock()


def checked(source: Source, clock: Clock) -> ParseLimits:
    return replace(CONFIG, schemas=SchemaCheck(source, clock=clock))


def their_proto(edit) -> descriptor_pb2.FileDescriptorProto:
    """timers.proto under another package, changed by ``edit`` (as a team's copy might be)."""
    proto = timers_proto()
    proto.package = "shop.timers"
    for message in proto.message_type:
        for f in message.field:
            f.type_name = f.type_name.replace(".kafka_timers.v1.", ".shop.timers.")
    edit({m.name: m for m in proto.message_type})
    return proto


def test_a_request_of_a_registered_compatible_schema_is_parsed(source, clock):
    limits = checked(source, clock)
    assert isinstance(parse(record(REQUEST, framed(7, 0, FUTURE)), limits)[0], Schedule)
    cancel = framed(7, 3, Cancel(id="a").SerializeToString())
    assert isinstance(parse(record(REQUEST, cancel), limits)[0], CancelRequest)
    batch = FutureBatch(futures=[Future.FromString(FUTURE)]).SerializeToString()
    assert isinstance(parse(record(REQUEST, framed(7, 2, batch)), limits)[0], Schedule)
    assert source.lookups == [7]  # once per schema id, whatever the message


def test_a_copy_with_other_fields_added_and_ours_missing_is_compatible(source, clock):
    def edit(messages):
        future = messages["Future"]
        del future.field[5:]  # no token, no headers
        future.field.add(name="region", number=40, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)

    source.add(8, their_proto(edit))
    assert isinstance(parse(record(REQUEST, framed(8, 0, FUTURE)), checked(source, clock))[0], Schedule)


@pytest.mark.parametrize(
    ("edit", "detail"),
    [
        (
            lambda m: setattr(m["Future"].field[0], "type", T.TYPE_INT64),
            "Future.callBackTopic (field 1) is int64 there, string here",
        ),
        (
            lambda m: setattr(m["Future"].field[6], "label", T.LABEL_OPTIONAL),
            "Future.headers (field 7) is message there, repeated message here",
        ),
        (
            lambda m: setattr(m["Header"].field[1], "type", T.TYPE_STRING),
            "Header.value (field 2) is string there, bytes here",
        ),
        (lambda m: setattr(m["Future"], "name", "Order"), "the message index names 'Order', not 'Future'"),
        (
            lambda m: setattr(m["Future"].field[6], "type_name", ".google.type.Header"),
            "names .google.type.Header, which the schema does not define itself",
        ),
    ],
)
def test_an_incompatible_schema_is_rejected_and_says_which_field(source, clock, edit, detail):
    source.add(9, their_proto(edit))
    rejection = rejected(record(REQUEST, framed(9, 0, FUTURE)), checked(source, clock))
    assert rejection.reason == "schema-rejected"
    assert detail in rejection.detail and "schema id 9" in rejection.detail


def test_an_unknown_schema_id_is_rejected_and_asked_again_later(source, clock):
    limits = checked(source, clock)
    rejection = rejected(record(REQUEST, framed(99, 0, FUTURE)), limits)
    assert rejection.reason == "schema-rejected"
    assert rejection.detail == "schema id 99 is not in the Schema Registry"
    rejected(record(REQUEST, framed(99, 0, FUTURE)), limits)
    assert source.lookups == [99]
    source.add(99, timers_proto())  # registered since
    clock.now += UNKNOWN_RETRY_S
    assert isinstance(parse(record(REQUEST, framed(99, 0, FUTURE)), limits)[0], Schedule)
    assert source.lookups == [99, 99]


def test_a_schema_that_is_not_protobuf_or_not_a_descriptor_is_rejected(source, clock):
    source.schemas[10] = Schema('{"type": "record", "name": "Future", "fields": []}', "AVRO")
    source.schemas[11] = Schema('syntax = "proto3"; message Future {}', "PROTOBUF")
    limits = checked(source, clock)
    assert "AVRO schema" in rejected(record(REQUEST, framed(10, 0, FUTURE)), limits).detail
    assert "serialized descriptor" in rejected(record(REQUEST, framed(11, 0, FUTURE)), limits).detail
    # An id's schema never changes: the registry is not asked about either again, however late.
    clock.now += 10 * UNKNOWN_RETRY_S
    rejected(record(REQUEST, framed(10, 0, FUTURE)), limits)
    rejected(record(REQUEST, framed(11, 0, FUTURE)), limits)
    assert source.lookups == [10, 11]


def test_a_registry_that_does_not_answer_is_left_alone_for_a_while(source, clock):
    limits = checked(source, clock)
    source.failure = ConnectionRefusedError("connection refused")
    for _ in range(3):
        rejection = rejected(record(REQUEST, framed(7, 0, FUTURE)), limits)
        assert rejection.reason == "schema-registry-unavailable"
        assert "ConnectionRefusedError" in rejection.detail
    assert source.lookups == [7]  # one wait, not one per record
    source.failure = None
    clock.now += UNAVAILABLE_FOR_S
    assert isinstance(parse(record(REQUEST, framed(7, 0, FUTURE)), limits)[0], Schedule)
    source.failure = ConnectionRefusedError("down again")
    # A verdict on a schema id is final: an id judged before needs no registry.
    assert isinstance(parse(record(REQUEST, framed(7, 0, FUTURE)), limits)[0], Schedule)
    assert source.lookups == [7, 7]


def test_a_slow_registry_stalls_parsing_at_most_its_timeout_once():
    with registry_stub() as stub:
        stub.add(7, timers_proto())
        source = SchemaRegistryConfig(url=stub.url, timeout_s=0.3).client()
        limits = replace(CONFIG, schemas=SchemaCheck(source))
        assert isinstance(parse(record(REQUEST, framed(7, 0, FUTURE)), limits)[0], Schedule)
        assert stub.requests == ["/schemas/ids/7?format=serialized"]
        assert rejected(record(REQUEST, framed(8, 0, FUTURE)), limits).reason == "schema-rejected"
        stub.delay_s = 3.0
        started = time.monotonic()
        for schema_id in (20, 21, 22):
            assert rejected(record(REQUEST, framed(schema_id, 0, FUTURE)), limits).reason == (
                "schema-registry-unavailable"
            )
        assert time.monotonic() - started < 2.0  # one timeout (connect, send, read), not three
        assert isinstance(parse(record(REQUEST, framed(7, 0, FUTURE)), limits)[0], Schedule)


def test_the_worker_builds_its_check_from_the_environment():
    with registry_stub() as stub:
        stub.add(7, timers_proto())
        config = WorkerConfig.from_env({"TIMERS_SCHEMA_REGISTRY_URL": stub.url})
        assert config.schema_registry == SchemaRegistryConfig(url=stub.url)
        limits = config.parse_limits
        assert isinstance(parse(record(REQUEST, framed(7, 0, FUTURE)), limits)[0], Schedule)
        assert rejected(record(REQUEST, framed(8, 0, FUTURE)), limits).reason == "schema-rejected"
    assert WorkerConfig.from_env({}).parse_limits.schemas is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TIMERS_SCHEMA_REGISTRY_URL": "registry:8081"}, "http:// or https://"),
        ({"TIMERS_SCHEMA_REGISTRY_TIMEOUT_S": "0"}, "above 0"),
        ({"TIMERS_SCHEMA_REGISTRY_BASIC_AUTH": "k"}, "user:password"),
    ],
)
def test_bad_registry_settings_say_what_to_fix(env, message):
    with pytest.raises(ConfigError, match=message):
        SchemaRegistryConfig.from_env({"TIMERS_SCHEMA_REGISTRY_URL": "http://r:8081", **env})


def test_the_registry_password_is_never_shown():
    config = SchemaRegistryConfig.from_env(
        {"TIMERS_SCHEMA_REGISTRY_URL": "https://r:8081", "TIMERS_SCHEMA_REGISTRY_BASIC_AUTH": "key:s3cret"}
    )
    assert config is not None and "s3cret" not in repr(config)


def test_the_helper_frames_as_the_serializer_does():
    cancel, future = Cancel(id="a"), Future.FromString(FUTURE)
    assert framed(1, 3, cancel.SerializeToString()) == serialized(cancel)
    assert framed(1, 0, FUTURE) == serialized(future)
