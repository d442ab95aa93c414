"""Producing records whose header keys are not UTF-8, as some clients do.

Neither confluent-kafka (it crashes on a key it cannot encode) nor aiokafka's C
extension will send one, so this uses aiokafka's pure-Python batch builder with
a key that encodes to the raw bytes given.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from unittest import mock

from aiokafka import AIOKafkaProducer
from aiokafka.producer import message_accumulator
from aiokafka.producer import producer as producer_module
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy


class RawKey(str):
    """A header key that the Python builder writes as the given bytes."""

    raw: bytes

    def __new__(cls, raw: bytes) -> RawKey:
        self = super().__new__(cls, raw.decode("latin-1"))
        self.raw = raw
        return self

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self.raw


def produce_raw(
    bootstrap: str,
    topic: str,
    records: Sequence[tuple[int, bytes | None, bytes | None, Sequence[tuple[bytes, bytes | None]]]],
    compression: str | None = None,
) -> None:
    """Send ``(partition, key, value, [(raw header key, header value)])`` records, in as few batches as
    the producer makes of them, and wait for all."""

    async def send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=50, compression_type=compression)
        await producer.start()
        try:
            sent = [
                await producer.send(
                    topic, value, key=key, partition=partition, headers=[(RawKey(k), v) for k, v in headers]
                )
                for partition, key, value, headers in records
            ]
            await asyncio.gather(*sent)
        finally:
            await producer.stop()

    python_builder = _DefaultRecordBatchBuilderPy
    with (
        mock.patch.object(message_accumulator, "DefaultRecordBatchBuilder", python_builder),
        mock.patch.object(producer_module, "DefaultRecordBatchBuilder", python_builder),
    ):
        asyncio.run(send())
