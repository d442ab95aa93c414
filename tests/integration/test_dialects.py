"""Schema Registry framing and per-request-topic callback lists, end to end on the embedded broker.

One worker serves the module. Its `timer-request` may only call back topics
``cb-req-*``, its second native request topic (team A's) only ``cb-team-a-*``;
it checks framed requests' schema ids against a registry on 127.0.0.1 that holds
proto/timers.proto under id 1 and an incompatible copy under id 2. Producers are
confluent-kafka's own ``SerializingProducer`` with ``ProtobufSerializer`` (its
``mock://`` registry gives timers.proto the id 1 too) and the timer client.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer, SerializingProducer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from google.protobuf import descriptor_pb2
from google.protobuf.message import Message

from futures.client import TimerClient
from ktimers.config import CommonConfig
from ktimers.topics import create_topics
from ktimers.wire import Cancel, Future, FutureBatch, Tick, header_value
from tests.ingress.registry_stub import RegistryStub, registry_stub, timers_proto
from tests.integration.conftest import Callback, Stack, fresh_env
from tests.integration.formats_stack import dump_logs_on_failure, module_stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def registry() -> Iterator[RegistryStub]:
    with registry_stub() as stub:
        stub.add(1, timers_proto())
        incompatible = timers_proto()
        incompatible.message_type[0].field[0].type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
        stub.add(2, incompatible)
        yield stub


@pytest.fixture(scope="module")
def team_topic() -> str:
    return f"timers-team-a-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def dialects(
    broker_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
    registry: RegistryStub,
    team_topic: str,
) -> Iterator[Stack]:
    settings = {
        "TIMERS_ALLOWED_CALLBACK_TOPICS": "cb-*",
        "TIMERS_REQUEST_ALLOWED_CALLBACK_TOPICS": "cb-req-*",
        "TIMERS_INGRESS_TOPICS": f"{team_topic}=native:cb-team-a-*",
        "TIMERS_SCHEMA_REGISTRY_URL": registry.url,
    }
    env = fresh_env(broker_env, settings=settings)
    create_topics(CommonConfig.from_env(env))
    with module_stack(env, tmp_path_factory.mktemp("dialects")) as stack:
        yield stack


@pytest.fixture(autouse=True)
def _logs_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "dialects" in request.fixturenames:
        dump_logs_on_failure(request, request.getfixturevalue("dialects"))


def produce_framed(stack: Stack, topic: str, messages: list[tuple[bytes | None, Message]]) -> None:
    """Produce (key, message) pairs as a team using Schema Registry does: its own serializer."""
    registry = SchemaRegistryClient.new_client({"url": f"mock://dialects-{uuid.uuid4().hex}"})
    for key, message in messages:
        serializer = ProtobufSerializer(type(message), registry)
        producer = SerializingProducer({"bootstrap.servers": stack.bootstrap, "value.serializer": serializer})
        producer.produce(topic, key=key, value=message)
        assert producer.flush(10) == 0


def produce_raw(stack: Stack, topic: str, value: bytes, key: bytes) -> None:
    producer = Producer({"bootstrap.servers": stack.bootstrap})
    producer.produce(topic, value, key)
    assert producer.flush(10) == 0


def dead_letters(stack: Stack, keys: set[bytes]) -> dict[bytes, Callback]:
    reader = stack.reader(stack.common.topics.dlq)
    reader.read_until(lambda r: keys <= {c.key for c in r}, timeout_s=30)
    return {c.key: c for c in reader.records if c.key in keys}


def reason(letter: Callback) -> str:
    return (header_value(letter.headers, "kt-reason") or b"").decode()


def error(letter: Callback) -> str:
    return (header_value(letter.headers, "kt-error") or b"").decode()


def test_framed_requests_from_the_serializer_fire_cancel_and_batch(dialects: Stack) -> None:
    stack, request = dialects, dialects.common.topics.request
    reader = stack.callback_topic("req")
    due_ms = int(time.time() * 1000) + 3000

    def future(timer_id: str) -> Future:
        return Future(callBackTopic=reader.topic, callBack=b"framed", id=timer_id, due_ms=due_ms)

    produce_framed(
        stack,
        request,
        [
            (b"single", future("single")),
            (b"cancelled", future("cancelled")),
            (b"cancelled", Cancel(id="cancelled")),
            (None, FutureBatch(futures=[future("batch-1"), future("batch-2")])),
        ],
    )
    reader.read_until(lambda r: len(r) >= 3, timeout_s=30)
    reader.poll(1.5)  # the cancelled one would arrive by now
    assert sorted(c.timer_id for c in reader.records) == ["batch-1", "batch-2", "single"]
    assert all(c.value == b"framed" and c.received_ms >= due_ms for c in reader.records)


def test_framed_requests_the_worker_cannot_read_are_dead_lettered_with_their_reason(dialects: Stack) -> None:
    stack, request = dialects, dialects.common.topics.request
    reader = stack.callback_topic("req")
    body = Future(callBackTopic=reader.topic, id="x", due_ms=int(time.time() * 1000)).SerializeToString()
    produce_framed(stack, request, [(b"a-tick", Tick(second=5))])
    produce_raw(stack, request, b"\x00" + (2).to_bytes(4, "big") + b"\x00" + body, b"incompatible")
    produce_raw(stack, request, b"\x00" + (99).to_bytes(4, "big") + b"\x00" + body, b"unregistered")
    letters = dead_letters(stack, {b"a-tick", b"incompatible", b"unregistered"})
    assert reason(letters[b"a-tick"]) == "unknown-message-index"
    assert reason(letters[b"incompatible"]) == "schema-rejected"
    assert "Future.callBackTopic (field 1) is bytes there, string here" in error(letters[b"incompatible"])
    assert (reason(letters[b"unregistered"]), error(letters[b"unregistered"])) == (
        "schema-rejected",
        "schema id 99 is not in the Schema Registry",
    )
    # Dead-lettered as sent, framing and all.
    assert letters[b"incompatible"].value.startswith(b"\x00\x00\x00\x00\x02")


def test_the_timer_client_frames_its_requests_for_a_registry(dialects: Stack) -> None:
    reader = dialects.callback_topic("req")
    registry = SchemaRegistryClient.new_client({"url": f"mock://dialects-client-{uuid.uuid4().hex}"})
    with TimerClient(dialects.common, schema_registry=registry) as client:
        client.schedule(reader.topic, "k", b"from the client", delay=1, id="client-framed")
    [callback] = reader.read_until(lambda r: len(r) >= 1, timeout_s=30)
    assert (callback.timer_id, callback.value) == ("client-framed", b"from the client")


def test_each_request_topic_reaches_only_its_own_callback_topics(dialects: Stack, team_topic: str) -> None:
    stack, request = dialects, dialects.common.topics.request
    team_reader, request_reader = stack.callback_topic("team-a"), stack.callback_topic("req")
    due_ms = int(time.time() * 1000) + 1000

    def future(topic: str, timer_id: str) -> bytes:
        return Future(callBackTopic=topic, id=timer_id, due_ms=due_ms).SerializeToString()

    produce_raw(stack, team_topic, future(team_reader.topic, "team-ok"), b"team-ok")
    produce_raw(stack, team_topic, future(request_reader.topic, "team-elsewhere"), b"team-elsewhere")
    produce_raw(stack, request, future(team_reader.topic, "request-elsewhere"), b"request-elsewhere")
    [fired] = team_reader.read_until(lambda r: len(r) >= 1, timeout_s=30)
    assert fired.timer_id == "team-ok"

    letters = dead_letters(stack, {b"team-elsewhere", b"request-elsewhere"})
    team_letter, request_letter = letters[b"team-elsewhere"], letters[b"request-elsewhere"]
    assert reason(team_letter) == reason(request_letter) == "callback-topic-not-allowed"
    assert error(team_letter) == (
        f"{request_reader.topic!r} is not allowed for request topic {team_topic!r}: "
        "not in its own list cb-team-a-* (TIMERS_INGRESS_TOPICS)"
    )
    assert f"for request topic {request!r}" in error(request_letter)
    assert header_value(team_letter.headers, "kt-source-topic") == team_topic.encode()
    request_reader.poll(1.0)
    assert request_reader.records == []  # nothing of team A's reached the other team's topic
