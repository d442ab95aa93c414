# cython: language_level=3, boundscheck=False, wraparound=False
"""Timer request values in protobuf's wire format, and new timer ids: compiled.

Every timer a client schedules is one ``Future`` value: a record of its own, or one element
of a ``FutureBatch``. A protobuf message built for it parses each keyword argument and copies
the fields in, then out again, which would be a third of what building a request costs the
client. :func:`encode_future` lays them out directly, in field number order as protobuf
serializes them, so the bytes are the ones protobuf would write
(``tests/client/test_request_wire.py`` checks both against any input). The fields a few
timers carry (headers, a recurrence) are serialized by protobuf and appended: a message's
fields may come in any order, and each of those appears once.
"""

import os

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcpy

from ktimers.protowire cimport *

# The tags (field number << 3 | wire type) written.
cdef unsigned char _TOPIC = (FUTURE_TOPIC << 3) | LEN
cdef unsigned char _KEY = (FUTURE_KEY << 3) | LEN
cdef unsigned char _PAYLOAD = (FUTURE_VALUE << 3) | LEN
cdef unsigned char _ID = (FUTURE_ID << 3) | LEN
cdef unsigned char _DUE_MS = (FUTURE_DUE_MS << 3) | VARINT
cdef unsigned char _TOKEN = (FUTURE_TOKEN << 3) | LEN
cdef unsigned char _FUTURES = (BATCH_FUTURES << 3) | LEN


cdef inline Py_ssize_t _field_size(bytes data):
    """A string or bytes field's size on the wire: none when empty (proto3 leaves it out)."""
    cdef Py_ssize_t size = PyBytes_GET_SIZE(data)
    return 0 if size == 0 else len_field_size(size)


cdef inline char* _put_field(char* at, unsigned char tag, bytes data):
    cdef Py_ssize_t size = PyBytes_GET_SIZE(data)
    return at if size == 0 else put_len_field(at, tag, PyBytes_AS_STRING(data), size)


def encode_future(
    bytes topic not None, bytes key not None, bytes payload not None, bytes timer_id not None,
    int64_t due_ms, bytes token not None, bytes rest not None,
):
    """A serialized ``Future``: callBackTopic, callBackKey (UTF-8), callBack, id, due_ms and token
    (b"": none), then ``rest``, serialized fields 7 and up (b"": none)."""
    # int64 on the wire: a negative value as its 64-bit two's complement, ten bytes.
    cdef uint64_t due = <uint64_t>due_ms
    cdef Py_ssize_t size = (
        _field_size(topic) + _field_size(key) + _field_size(payload) + _field_size(timer_id)
        + 1 + varint_size(due) + _field_size(token) + PyBytes_GET_SIZE(rest)
    )
    cdef bytes out = PyBytes_FromStringAndSize(NULL, size)
    cdef char* at = PyBytes_AS_STRING(out)
    at = _put_field(at, _TOPIC, topic)
    at = _put_field(at, _KEY, key)
    at = _put_field(at, _PAYLOAD, payload)
    at = _put_field(at, _ID, timer_id)
    at[0] = <char>_DUE_MS
    at = put_varint(at + 1, due)
    at = _put_field(at, _TOKEN, token)
    memcpy(at, PyBytes_AS_STRING(rest), PyBytes_GET_SIZE(rest))
    return out


cdef bytes _join(list futures, Py_ssize_t start, Py_ssize_t end, Py_ssize_t size):
    """``futures[start:end]`` as one ``FutureBatch`` of ``size`` bytes: each an element, empty or not."""
    cdef bytes out = PyBytes_FromStringAndSize(NULL, size)
    cdef char* at = PyBytes_AS_STRING(out)
    cdef bytes future
    cdef Py_ssize_t i
    for i in range(start, end):
        future = <bytes>futures[i]
        at = put_len_field(at, _FUTURES, PyBytes_AS_STRING(future), PyBytes_GET_SIZE(future))
    return out


def batch_values(list futures not None, Py_ssize_t max_count, Py_ssize_t max_bytes):
    """Serialized ``FutureBatch`` values holding the serialized ``futures`` (bytes), in order,
    each of at most ``max_count`` of them and ``max_bytes`` (a single larger one alone).

    Laid out as protobuf lays out a repeated message field (each element tagged and
    length-prefixed, one after the other), without a message object per timer.
    """
    cdef list values = []
    cdef Py_ssize_t count = len(futures)
    cdef Py_ssize_t start = 0, size = 0, i, element
    for i in range(count):
        if not isinstance(futures[i], bytes):
            raise TypeError(f"a serialized Future (bytes) is needed, not {type(futures[i]).__name__}")
        element = len_field_size(PyBytes_GET_SIZE(<bytes>futures[i]))
        if i > start and (i - start >= max_count or size + element > max_bytes):
            values.append(_join(futures, start, i, size))
            start, size = i, 0
        size += element
    if count > start:
        values.append(_join(futures, start, count, size))
    return values


# -- timer ids -------------------------------------------------------------------------------

#: Random bytes drawn from the OS at once: 256 ids' worth.
cdef Py_ssize_t _POOL_BYTES = 16 * 256
cdef bytes _pool = b""
cdef Py_ssize_t _taken = 0
cdef const char* _HEX = b"0123456789abcdef"


def _forget_pool():
    """A forked child draws its own: ids taken from the parent's bytes would repeat the parent's."""
    global _pool, _taken
    _pool, _taken = b"", 0


os.register_at_fork(after_in_child=_forget_pool)


def random_id():
    """A new timer id: a random uuid4 as 32 hex digits, as ``uuid.uuid4().hex`` gives it.

    Its 16 random bytes come from the OS (``os.urandom``, as ``uuid4`` takes them), drawn
    256 ids at a time: a system call per id would be half of what the id costs. Safe from any
    thread: nothing between taking the bytes and moving past them lets another thread run.
    """
    global _pool, _taken
    if _taken + 16 > PyBytes_GET_SIZE(_pool):
        fresh = os.urandom(_POOL_BYTES)  # may let other threads run: each draws its own
        _pool, _taken = fresh, 0
    cdef const unsigned char* raw = <const unsigned char*>PyBytes_AS_STRING(_pool) + _taken
    _taken += 16
    cdef unsigned char digits[16]
    memcpy(digits, raw, 16)
    digits[6] = (digits[6] & 0x0F) | 0x40  # version 4
    digits[8] = (digits[8] & 0x3F) | 0x80  # variant RFC 4122
    cdef char text[32]
    cdef int i
    for i in range(16):
        text[2 * i] = _HEX[digits[i] >> 4]
        text[2 * i + 1] = _HEX[digits[i] & 0x0F]
    return text[:32].decode("ascii")
