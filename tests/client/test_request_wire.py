"""A timer's request as the client lays it out, and the ids it draws."""

from __future__ import annotations

import os
import threading
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from futures.client.request_wire import encode_future, random_id
from ktimers.wire import Future, Header

INT64 = st.integers(-(2**63), 2**63 - 1)
HEADERS = st.lists(st.tuples(st.text(min_size=1), st.binary()), max_size=3)


@settings(max_examples=300, deadline=None)
@given(
    topic=st.text(min_size=1),
    key=st.text(),
    payload=st.binary(max_size=20_000),
    timer_id=st.text(min_size=1),
    due_ms=INT64,
    token=st.text(),
    headers=HEADERS,
)
def test_a_request_is_the_bytes_protobuf_writes(topic, key, payload, timer_id, due_ms, token, headers):
    """Byte for byte, so the worker (and any other reader) parses it as the message it is."""
    expected = Future(
        callBackTopic=topic,
        callBackKey=key,
        callBack=payload,
        id=timer_id,
        due_ms=due_ms,
        token=token,
        headers=[Header(key=k, value=v) for k, v in headers],
    )
    rest = Future(headers=expected.headers).SerializeToString()
    value = encode_future(
        topic.encode(), key.encode(), payload, timer_id.encode(), due_ms, token.encode(), rest
    )
    assert value == expected.SerializeToString()
    assert Future.FromString(value) == expected


def test_a_due_time_of_zero_is_still_written():
    """``due_ms`` has presence: a request without it is read in the seed format, by its key."""
    parsed = Future.FromString(encode_future(b"t", b"", b"", b"id", 0, b"", b""))
    assert parsed.HasField("due_ms") and parsed.due_ms == 0


def test_none_for_a_field_is_a_type_error():
    with pytest.raises(TypeError):
        encode_future(b"t", None, b"", b"id", 0, b"", b"")  # type: ignore[arg-type]


def test_ids_are_uuid4_hex_and_never_repeat():
    ids = [random_id() for _ in range(20_000)]  # many times the ids drawn from the OS at once
    assert len(set(ids)) == len(ids)
    for timer_id in ids[:600]:
        parsed = uuid.UUID(hex=timer_id)
        assert parsed.hex == timer_id and parsed.version == 4 and parsed.variant == uuid.RFC_4122


def test_threads_drawing_ids_at_once_get_different_ones():
    drawn: list[list[str]] = [[] for _ in range(4)]
    start = threading.Barrier(len(drawn))

    def draw(into: list[str]) -> None:
        start.wait()
        into.extend(random_id() for _ in range(5_000))

    threads = [threading.Thread(target=draw, args=(into,)) for into in drawn]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [timer_id for into in drawn for timer_id in into]
    assert len(set(every)) == len(every) == 20_000


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_process_draws_ids_of_its_own():
    random_id()  # the parent holds random bytes not yet used
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's
        os.close(read_end)
        os.write(write_end, " ".join(random_id() for _ in range(100)).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        child_ids = set(pipe.read().split())
    os.waitpid(child, 0)
    parent_ids = {random_id() for _ in range(100)}
    assert len(child_ids) == 100 and not child_ids & parent_ids
