"""Which partition a keyed record lands in, computed the way the producer computes it.

Bulk scheduling packs many timers into one record, and that record's partition
holds them all. For cancels and replacements keyed by a timer's id to reach the
same partition, the client groups timers by the partition their id would be
produced to — which means knowing the producer's partitioner. Only the
deterministic ones can be followed: librdkafka's default ``consistent_random``
(CRC32 of the key) and ``murmur2_random`` (the Java client's default).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

from ktimers.errors import ConfigError

#: librdkafka's default partitioner (``partitioner`` unset).
DEFAULT_PARTITIONER = "consistent_random"

PartitionFn = Callable[[bytes, int], int]


def crc32_partition(key: bytes, partitions: int) -> int:
    """librdkafka ``consistent``/``consistent_random``: CRC32 of the key, modulo the count."""
    return zlib.crc32(key) % partitions


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash (the Java client's), as an unsigned 32-bit integer."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    rest = length % 4
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def murmur2_partition(key: bytes, partitions: int) -> int:
    """librdkafka ``murmur2``/``murmur2_random`` and the Java client's default."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


_PARTITIONERS: dict[str, PartitionFn] = {
    "consistent": crc32_partition,
    "consistent_random": crc32_partition,
    "murmur2": murmur2_partition,
    "murmur2_random": murmur2_partition,
}


def partitioner_for(name: str | None) -> PartitionFn:
    """The partition function of librdkafka's ``partitioner`` setting (None: the default)."""
    fn = _PARTITIONERS.get(name or DEFAULT_PARTITIONER)
    if fn is None:
        raise ConfigError(
            f"partitioner={name!r}: bulk scheduling must know which partition each timer id maps to; "
            f"use one of {', '.join(sorted(_PARTITIONERS))}"
        )
    return fn
