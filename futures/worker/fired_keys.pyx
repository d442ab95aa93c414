# cython: language_level=3, boundscheck=False, wraparound=False
"""The value of an ``f`` record, the fired timers' table keys it lists: compiled.

Each key is written after its length (2 bytes, big-endian), one after the other. A firing
packs the keys of every timer it delivered into such records, and the table's write takes
them apart again to delete the timers: once each per fired timer, where a loop in the
interpreter cost the engine a share of a fired timer (docs/PERFORMANCE.md#firing-a-timer).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.string cimport memcpy

#: Bytes of keys an ``f`` record lists at most: a record far below librdkafka's ``message.max.bytes``.
FIRED_RECORD_BYTES = 256 * 1024

cdef Py_ssize_t _MAX_KEY = 0xFFFF


cdef bytes _join(list keys, Py_ssize_t start, Py_ssize_t end, Py_ssize_t size):
    cdef bytes value = PyBytes_FromStringAndSize(NULL, size)
    cdef char *out = PyBytes_AS_STRING(value)
    cdef Py_ssize_t i, length
    cdef bytes key
    for i in range(start, end):
        key = <bytes>keys[i]
        length = PyBytes_GET_SIZE(key)
        out[0] = <char>(length >> 8)
        out[1] = <char>(length & 0xFF)
        memcpy(out + 2, PyBytes_AS_STRING(key), length)
        out += 2 + length
    return value


def pack_keys(keys, Py_ssize_t max_bytes=FIRED_RECORD_BYTES):
    """``keys`` as the values of ``f`` records, each a run of (length, key) of at most
    ``max_bytes`` (or one key)."""
    cdef list listed = list(keys)
    cdef list values = []
    cdef Py_ssize_t i, start = 0, size = 0, length, n = len(listed)
    for i in range(n):
        key = listed[i]
        if type(key) is not bytes:
            raise TypeError(f"a fired timer's key must be bytes, not {type(key).__name__}")
        length = PyBytes_GET_SIZE(key)
        if length > _MAX_KEY:
            raise ValueError(f"a table key of {length} bytes is longer than an f record lists")
        if size + length + 2 > max_bytes and i > start:
            values.append(_join(listed, start, i, size))
            start, size = i, 0
        size += length + 2
    if n > start:
        values.append(_join(listed, start, n, size))
    return values


def unpack_keys(bytes value):
    """The keys an ``f`` record's value lists; ``ValueError`` if it is cut short."""
    cdef const unsigned char *data = <const unsigned char *>PyBytes_AS_STRING(value)
    cdef Py_ssize_t at = 0, end = PyBytes_GET_SIZE(value), length
    cdef list keys = []
    while at < end:
        if end - at < 2:
            raise ValueError("an f record's value ends inside a key's length")
        length = (data[at] << 8) | data[at + 1]
        at += 2
        if length > end - at:
            raise ValueError("an f record's value ends inside a key")
        keys.append(PyBytes_FromStringAndSize(<const char *>data + at, length))
        at += length
    return keys
