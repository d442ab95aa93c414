"""A record whose header key is not UTF-8 reaches the consumer, with its batch, instead of stopping it."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from futures.worker import fetch
from tests.raw_headers import produce_raw

pytestmark = pytest.mark.integration


async def _read(bootstrap: str, topic: str, count: int) -> list:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        got: list = []
        for _ in range(50):
            for records in (await consumer.getmany(timeout_ms=200)).values():
                got += records
            if len(got) >= count:
                break
        return got
    finally:
        await consumer.stop()


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_a_header_key_that_is_not_utf8_is_delivered_escaped_with_the_rest_of_its_batch(
    broker_env, compression
):
    bootstrap = broker_env["KAFKA_BOOTSTRAP_SERVERS"]
    topic = f"fetch-{uuid.uuid4().hex[:8]}"
    records = [
        (0, b"k0", b"before", [(b"ok", b"1")]),
        (0, b"k1", b"bad", [(b"\xff\xfeid", b"x"), (b"fine", None)]),
        (0, b"k2", b"after", [(b"ok", b"2")]),
    ]
    produce_raw(bootstrap, topic, records, compression=compression)
    fetch.install()

    got = asyncio.run(_read(bootstrap, topic, 3))

    assert [(r.offset, r.value) for r in got] == [(0, b"before"), (1, b"bad"), (2, b"after")]
    assert got[1].headers == (("\udcff\udcfeid", b"x"), ("fine", None))  # the bytes survive: surrogateescape
    assert got[0].headers == (("ok", b"1"),) and got[2].headers == (("ok", b"2"),)
