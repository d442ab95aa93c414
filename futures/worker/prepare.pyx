# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""A due timer's callback, read from the timer's bytes in the table: compiled.

Every fired timer goes through :func:`prepare` once (before its tick where the worker can,
:mod:`futures.worker.lookahead`). Parsing the ``StoredTimer`` with protobuf and reading its
fields back out of the message object was a third of what firing a timer cost the engine
(`make bench-engine`), almost all of it in the interpreter and in protobuf's attribute access.
This reads the protobuf wire format straight into the :class:`~futures.worker.callbacks.Callback`
tuple, with protobuf's semantics for what the worker writes and for what it may read back:

* fields in any order, a singular field given more than once: the last wins; an embedded
  message given more than once (the ``Future``, its ``Recurrence``): merged; repeated
  headers: each occurrence one more header;
* unknown fields, and known ones with another wire type, skipped;
* strings are checked to be UTF-8, as protobuf checks them.

Anything else — a truncated field, a length past the end, a varint of more than ten bytes,
field number 0, a group (no message of ours has one), text that is not UTF-8 — raises
``google.protobuf.message.DecodeError``, as parsing the message with protobuf would.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint64_t

import sys

from google.protobuf.message import DecodeError

from futures.worker.callbacks import Callback
from ktimers.wire import H_OCCURRENCE

# Wire types (https://protobuf.dev/programming-guides/encoding/).
cdef enum:
    VARINT = 0
    I64 = 1
    LEN = 2
    I32 = 5

# Field numbers read (proto/timers.proto); every other field is skipped.
cdef enum:
    STORED_FUTURE = 1  # StoredTimer.future
    STORED_SOURCE_OFFSET = 3  # StoredTimer.source_offset
    FUTURE_TOPIC = 1  # Future.callBackTopic
    FUTURE_KEY = 2  # Future.callBackKey
    FUTURE_VALUE = 3  # Future.callBack
    FUTURE_ID = 4  # Future.id
    FUTURE_DUE_MS = 5  # Future.due_ms
    FUTURE_TOKEN = 6  # Future.token
    FUTURE_HEADERS = 7  # Future.headers
    FUTURE_RECURRENCE = 8  # Future.recurrence
    HEADER_KEY = 1  # Header.key
    HEADER_VALUE = 2  # Header.value
    RECURRENCE_ORDINAL = 6  # Recurrence.ordinal

cdef object _intern = sys.intern
# A namedtuple is a tuple of its class: built without its Python-level ``__new__``.
cdef object _new_tuple = tuple.__new__
cdef object _Callback = Callback
cdef str _H_OCCURRENCE = H_OCCURRENCE
cdef bytes _EMPTY = b""


cdef class _Fields:
    """What :func:`prepare` reads of a ``StoredTimer``, its defaults protobuf's."""

    cdef object topic
    cdef bytes key
    cdef bytes value
    cdef object timer_id
    cdef bytes id_bytes
    cdef int64_t due_ms
    cdef bytes token
    cdef list headers
    cdef bint series
    cdef int64_t ordinal
    cdef int64_t source_offset

    def __cinit__(self):
        self.topic = ""
        self.key = _EMPTY
        self.value = _EMPTY
        self.timer_id = ""
        self.id_bytes = _EMPTY
        self.token = _EMPTY
        self.headers = None


cdef inline int _varint(const unsigned char* buf, Py_ssize_t* at, Py_ssize_t end, uint64_t* out) except -1:
    cdef uint64_t result = 0
    cdef int shift = 0
    cdef Py_ssize_t i = at[0]
    cdef unsigned char byte
    while True:
        if i >= end:
            raise DecodeError("Error parsing message: truncated varint")
        if shift >= 70:
            raise DecodeError("Error parsing message: varint longer than ten bytes")
        byte = buf[i]
        i += 1
        if shift < 64:
            result |= (<uint64_t>(byte & 0x7F)) << shift
        shift += 7
        if not byte & 0x80:
            break
    at[0] = i
    out[0] = result
    return 0


cdef inline Py_ssize_t _length(const unsigned char* buf, Py_ssize_t* at, Py_ssize_t end) except -1:
    """A length-delimited field's length, checked to lie within ``end``."""
    cdef uint64_t n
    _varint(buf, at, end, &n)
    if n > <uint64_t>(end - at[0]):
        raise DecodeError("Error parsing message: a field's length runs past the end")
    return <Py_ssize_t>n


cdef inline int _skip(const unsigned char* buf, Py_ssize_t* at, Py_ssize_t end, int wire) except -1:
    cdef uint64_t ignored
    cdef Py_ssize_t size
    if wire == VARINT:
        _varint(buf, at, end, &ignored)
        return 0
    if wire == LEN:
        size = _length(buf, at, end)
    elif wire == I64:
        size = 8
    elif wire == I32:
        size = 4
    else:
        raise DecodeError(f"Error parsing message: wire type {wire} (groups are not read)")
    if size > end - at[0]:
        raise DecodeError("Error parsing message: truncated field")
    at[0] += size
    return 0


cdef inline int _tag(const unsigned char* buf, Py_ssize_t* at, Py_ssize_t end, uint64_t* field) except -1:
    """The next field's number into ``field``; its wire type returned."""
    cdef uint64_t tag
    _varint(buf, at, end, &tag)
    field[0] = tag >> 3
    if field[0] == 0 or field[0] > 536870911:
        raise DecodeError("Error parsing message: invalid field number")
    return <int>(tag & 7)


cdef inline str _text(const unsigned char* buf, Py_ssize_t at, Py_ssize_t size):
    try:
        return (<bytes>PyBytes_FromStringAndSize(<const char*>buf + at, size)).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError(f"Error parsing message: a string field is not UTF-8 ({exc.reason})") from exc


cdef inline bytes _utf8(const unsigned char* buf, Py_ssize_t at, Py_ssize_t size):
    """A string field's bytes, checked to be UTF-8."""
    cdef bytes raw = PyBytes_FromStringAndSize(<const char*>buf + at, size)
    cdef Py_ssize_t i
    for i in range(size):
        if buf[at + i] & 0x80:  # not plain ASCII: let the codec check it
            _text(buf, at, size)
            break
    return raw


cdef bytes _decimal(int64_t number):
    """``str(number).encode()``."""
    cdef char digits[24]
    cdef int at = 24
    cdef uint64_t rest = <uint64_t>(-number) if number < 0 else <uint64_t>number
    while True:
        at -= 1
        digits[at] = <char>(48 + rest % 10)
        rest //= 10
        if rest == 0:
            break
    if number < 0:
        at -= 1
        digits[at] = 45  # "-"
    return PyBytes_FromStringAndSize(digits + at, 24 - at)


cdef int _header(const unsigned char* buf, Py_ssize_t at, Py_ssize_t end, _Fields fields) except -1:
    cdef uint64_t field
    cdef int wire
    cdef Py_ssize_t size
    cdef object name = ""
    cdef bytes value = _EMPTY
    while at < end:
        wire = _tag(buf, &at, end, &field)
        if wire == LEN and (field == HEADER_KEY or field == HEADER_VALUE):
            size = _length(buf, &at, end)
            if field == HEADER_KEY:
                name = _text(buf, at, size)
            else:
                value = PyBytes_FromStringAndSize(<const char*>buf + at, size)
            at += size
        else:
            _skip(buf, &at, end, wire)
    if fields.headers is None:
        fields.headers = []
    fields.headers.append((name, value))
    return 0


cdef int _recurrence(const unsigned char* buf, Py_ssize_t at, Py_ssize_t end, _Fields fields) except -1:
    cdef uint64_t field, number
    cdef int wire
    fields.series = True
    while at < end:
        wire = _tag(buf, &at, end, &field)
        if wire == VARINT and field == RECURRENCE_ORDINAL:
            _varint(buf, &at, end, &number)
            fields.ordinal = <int64_t>number
        else:
            _skip(buf, &at, end, wire)
    return 0


cdef int _future(const unsigned char* buf, Py_ssize_t at, Py_ssize_t end, _Fields fields) except -1:
    cdef uint64_t field, number
    cdef int wire
    cdef Py_ssize_t size
    while at < end:
        wire = _tag(buf, &at, end, &field)
        if wire == LEN and FUTURE_TOPIC <= field <= FUTURE_RECURRENCE and field != FUTURE_DUE_MS:
            size = _length(buf, &at, end)
            if field == FUTURE_TOPIC:
                fields.topic = _text(buf, at, size)
            elif field == FUTURE_KEY:
                fields.key = _utf8(buf, at, size)
            elif field == FUTURE_VALUE:
                fields.value = PyBytes_FromStringAndSize(<const char*>buf + at, size)
            elif field == FUTURE_ID:
                fields.timer_id = _text(buf, at, size)
                fields.id_bytes = PyBytes_FromStringAndSize(<const char*>buf + at, size)
            elif field == FUTURE_TOKEN:
                fields.token = _utf8(buf, at, size)
            elif field == FUTURE_HEADERS:
                _header(buf, at, at + size, fields)
            else:
                _recurrence(buf, at, at + size, fields)
            at += size
        elif wire == VARINT and field == FUTURE_DUE_MS:
            _varint(buf, &at, end, &number)
            fields.due_ms = <int64_t>number
        else:
            _skip(buf, &at, end, wire)
    return 0


def prepare(bytes key, int partition, bytes stored not None):
    """The callback of the timer stored under table key ``key`` as ``stored`` (its
    ``StoredTimer`` bytes) in ``partition``'s table."""
    cdef const unsigned char* buf = <const unsigned char*>PyBytes_AS_STRING(stored)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(stored)
    cdef Py_ssize_t at = 0
    cdef Py_ssize_t size
    cdef uint64_t field, number
    cdef int wire
    cdef _Fields fields = _Fields.__new__(_Fields)
    while at < end:
        wire = _tag(buf, &at, end, &field)
        if wire == LEN and field == STORED_FUTURE:
            size = _length(buf, &at, end)
            _future(buf, at, at + size, fields)
            at += size
        elif wire == VARINT and field == STORED_SOURCE_OFFSET:
            _varint(buf, &at, end, &number)
            fields.source_offset = <int64_t>number
        else:
            _skip(buf, &at, end, wire)
    own = () if fields.headers is None else tuple(fields.headers)
    cdef int64_t occurrence = 0
    if fields.series:
        occurrence = fields.ordinal if fields.ordinal > 1 else 1
        own = (*own, (_H_OCCURRENCE, _decimal(occurrence)))
    return _new_tuple(
        _Callback,
        (
            key,
            partition,
            _intern(fields.topic),  # one string per topic, not one per prepared callback
            fields.key,
            fields.value,
            fields.timer_id,
            fields.due_ms,
            fields.source_offset,
            fields.id_bytes,
            _decimal(fields.due_ms),
            own,
            fields.token,
            occurrence,
        ),
    )
