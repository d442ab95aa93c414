"""Batch request values in protobuf's wire format, and new timer ids: pure Python.

A timer's own ``Future`` is serialized by protobuf (its C parser and serializer, upb); what this
module adds is what protobuf would do slower: joining many serialized ``Future`` values into
``FutureBatch`` values without parsing them back into messages, and drawing ids from the OS a
few hundred at a time. docs/PERFORMANCE.md gives what a request costs the client.
"""

from __future__ import annotations

import itertools
import os

#: ``FutureBatch.futures`` (field 1, length-delimited): the tag in front of every element.
_FUTURES_TAG = 0x0A
#: An element's tag and length where the length takes one byte.
_SMALL_PREFIXES = [bytes((_FUTURES_TAG, n)) for n in range(128)]


def _prefix(n: int) -> bytes:
    """The tag and the length (a varint: seven bits a byte, least significant first) of an
    element of ``n`` bytes."""
    if n < 128:
        return _SMALL_PREFIXES[n]
    if n < 16384:
        return bytes((_FUTURES_TAG, n & 0x7F | 0x80, n >> 7))
    out = bytearray((_FUTURES_TAG,))
    while n > 127:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def batch_values(futures: list[bytes], max_count: int, max_bytes: int) -> list[bytes]:
    """Serialized ``FutureBatch`` values holding the serialized ``futures``, in order, each of at
    most ``max_count`` of them and ``max_bytes`` (a single larger one alone).

    Laid out as protobuf lays out a repeated message field (each element tagged and
    length-prefixed, one after the other), without a message object per timer.
    """
    values = []
    parts: list[bytes] = []
    count = size = 0
    for future in futures:
        prefix = _prefix(len(future))
        element = len(prefix) + len(future)
        if count and (count >= max_count or size + element > max_bytes):
            values.append(b"".join(parts))
            parts, count, size = [], 0, 0
        parts += (prefix, future)
        count += 1
        size += element
    if count:
        values.append(b"".join(parts))
    return values


# -- timer ids -------------------------------------------------------------------------------

_IDS_PER_DRAW = 256
#: Random bytes drawn from the OS at once, and a counter of the ids taken from them. One tuple, so
#: a thread reads both at once; ``next`` on an ``itertools.count`` never gives two threads one number.
_pool: tuple[bytes, itertools.count[int]] = (b"", itertools.count(_IDS_PER_DRAW))


def _forget_pool() -> None:
    """A forked child draws its own: ids taken from the parent's bytes would repeat the parent's."""
    global _pool
    _pool = (b"", itertools.count(_IDS_PER_DRAW))


os.register_at_fork(after_in_child=_forget_pool)


def random_id() -> str:
    """A new timer id: a random uuid4 as 32 hex digits, as ``uuid.uuid4().hex`` gives it.

    Its 16 random bytes come from the OS (``os.urandom``, as ``uuid4`` takes them), drawn
    256 ids at a time: a system call and a ``UUID`` object per id would cost five times as much.
    Threads that find the bytes used up at once each draw fresh ones: none takes another's.
    """
    global _pool
    while True:
        pool, taken = _pool
        n = next(taken)
        if n < _IDS_PER_DRAW:
            break
        _pool = (os.urandom(16 * _IDS_PER_DRAW), itertools.count())
    raw = bytearray(pool[16 * n : 16 * n + 16])
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # variant RFC 4122
    return raw.hex()
