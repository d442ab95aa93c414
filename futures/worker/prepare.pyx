# cython: language_level=3, boundscheck=False, wraparound=False
"""A due timer's callback, read from the timer's bytes in the table: compiled.

Every fired timer goes through :func:`prepare` once (before its tick where the worker can,
:mod:`futures.worker.lookahead`). Parsing the ``StoredTimer`` with protobuf and reading its
fields back out of the message object was a third of what firing a timer cost the engine
(``make bench-engine``), almost all of it in the interpreter and in protobuf's attribute
access. This reads the protobuf wire format straight into the
:class:`~futures.worker.callbacks.Callback` tuple, with protobuf's semantics:

* fields in any order; a singular field given more than once: the last wins; an embedded
  message given more than once (the ``Future``, its ``Recurrence``): merged; repeated
  headers: each occurrence one more header;
* unknown fields of every wire type (groups too: no message of ours has one), and known
  fields with another wire type, skipped;
* strings are checked to be UTF-8, as protobuf checks them.

What protobuf refuses (``ktimers/protowire.pxd`` lists it: a truncated field, a length past
the end, a varint of more than ten bytes, field number 0, an unmatched end-group, text that
is not UTF-8 …) raises ``google.protobuf.message.DecodeError``, as parsing the message with
protobuf would; ``tests/worker/test_prepare.py`` checks both against any bytes. The fire path
dead-letters a timer whose bytes are refused (:mod:`futures.worker.firing`).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint64_t

from ktimers.protowire cimport *

import sys

from google.protobuf.message import DecodeError

from futures.worker.callbacks import Callback
from ktimers.wire import H_OCCURRENCE

cdef object _intern = sys.intern
# A namedtuple is a tuple of its class: built without its Python-level ``__new__``.
cdef object _new_tuple = tuple.__new__
cdef object _Callback = Callback
cdef str _H_OCCURRENCE = H_OCCURRENCE
cdef bytes _EMPTY = b""


cdef class _Fields:
    """What :func:`prepare` reads of a ``StoredTimer``, its defaults protobuf's."""

    cdef str topic
    cdef bytes key
    cdef bytes value
    cdef str timer_id
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


cdef inline int _refuse() except -1:
    raise DecodeError("Error parsing message")


cdef inline bytes _raw(const unsigned char* buf, Py_ssize_t at, Py_ssize_t size):
    return PyBytes_FromStringAndSize(<const char*>buf + at, size)


cdef inline int _check_utf8(const unsigned char* buf, Py_ssize_t at, Py_ssize_t size) except -1:
    """Refuses a string field's bytes that are not UTF-8, as protobuf does."""
    if not is_utf8(buf + at, size):
        _refuse()
    return 0


cdef inline bytes _utf8(const unsigned char* buf, Py_ssize_t at, Py_ssize_t size):
    """A string field's bytes, checked to be UTF-8."""
    _check_utf8(buf, at, size)
    return _raw(buf, at, size)


cdef inline str _text(const unsigned char* buf, Py_ssize_t at, Py_ssize_t size):
    return _utf8(buf, at, size).decode("utf-8")


cdef bytes _decimal(int64_t number):
    """``str(number).encode()``."""
    cdef char digits[24]
    cdef int at = 24
    cdef uint64_t rest = (<uint64_t>0 - <uint64_t>number) if number < 0 else <uint64_t>number
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


cdef Py_ssize_t _length(const unsigned char* buf, Py_ssize_t* at, Py_ssize_t end) except -1:
    cdef Py_ssize_t size = read_length(buf, at, end)
    if size < 0:
        _refuse()
    return size


cdef int _tag(const unsigned char* buf, Py_ssize_t* at, Py_ssize_t end, uint64_t* field) except -1:
    cdef int wire = read_tag(buf, at, end, field)
    if wire < 0:
        _refuse()
    return wire


cdef int64_t _int64(const unsigned char* buf, Py_ssize_t* at, Py_ssize_t end) except? -1:
    cdef uint64_t number
    if read_varint(buf, at, end, &number) < 0:
        _refuse()
    return <int64_t>number


cdef int _skip_text(const unsigned char* buf, Py_ssize_t* at, Py_ssize_t end) except -1:
    """Step over a string field this does not keep, refused unless UTF-8, as protobuf refuses it."""
    cdef Py_ssize_t size = _length(buf, at, end)
    _check_utf8(buf, at[0], size)
    at[0] += size
    return 0


cdef int _skip(
    const unsigned char* buf, Py_ssize_t* at, Py_ssize_t end, int wire, uint64_t field, int depth
) except -1:
    if skip_field(buf, at, end, wire, field, depth) < 0:
        _refuse()
    return 0


cdef int _header(const unsigned char* buf, Py_ssize_t at, Py_ssize_t end, _Fields fields) except -1:
    cdef uint64_t field
    cdef int wire
    cdef Py_ssize_t size
    cdef str name = ""
    cdef bytes value = _EMPTY
    while at < end:
        wire = _tag(buf, &at, end, &field)
        if wire == LEN and (field == HEADER_KEY or field == HEADER_VALUE):
            size = _length(buf, &at, end)
            if field == HEADER_KEY:
                name = _text(buf, at, size)
            else:
                value = _raw(buf, at, size)
            at += size
        else:
            _skip(buf, &at, end, wire, field, 2)
    if fields.headers is None:
        fields.headers = []
    fields.headers.append((name, value))
    return 0


cdef int _recurrence(const unsigned char* buf, Py_ssize_t at, Py_ssize_t end, _Fields fields) except -1:
    cdef uint64_t field
    cdef int wire
    fields.series = True
    while at < end:
        wire = _tag(buf, &at, end, &field)
        if wire == VARINT and field == RECURRENCE_ORDINAL:
            fields.ordinal = _int64(buf, &at, end)
        elif wire == LEN and (field == RECURRENCE_CRON or field == RECURRENCE_TIME_ZONE):
            _skip_text(buf, &at, end)
        else:
            _skip(buf, &at, end, wire, field, 2)
    return 0


cdef int _future(const unsigned char* buf, Py_ssize_t at, Py_ssize_t end, _Fields fields) except -1:
    cdef uint64_t field
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
                fields.value = _raw(buf, at, size)
            elif field == FUTURE_ID:
                fields.id_bytes = _utf8(buf, at, size)
                fields.timer_id = fields.id_bytes.decode("utf-8")
            elif field == FUTURE_TOKEN:
                fields.token = _utf8(buf, at, size)
            elif field == FUTURE_HEADERS:
                _header(buf, at, at + size, fields)
            else:
                _recurrence(buf, at, at + size, fields)
            at += size
        elif wire == VARINT and field == FUTURE_DUE_MS:
            fields.due_ms = _int64(buf, &at, end)
        else:
            _skip(buf, &at, end, wire, field, 1)
    return 0


def prepare(bytes key, int partition, bytes stored not None):
    """The callback of the timer stored under table key ``key`` as ``stored`` (its
    ``StoredTimer`` bytes) in ``partition``'s table."""
    cdef const unsigned char* buf = <const unsigned char*>PyBytes_AS_STRING(stored)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(stored)
    cdef Py_ssize_t at = 0
    cdef Py_ssize_t size
    cdef uint64_t field
    cdef int wire
    cdef int64_t occurrence = 0
    cdef _Fields fields = _Fields.__new__(_Fields)
    while at < end:
        wire = _tag(buf, &at, end, &field)
        if wire == LEN and field == STORED_FUTURE:
            size = _length(buf, &at, end)
            _future(buf, at, at + size, fields)
            at += size
        elif wire == VARINT and field == STORED_SOURCE_OFFSET:
            fields.source_offset = _int64(buf, &at, end)
        elif wire == LEN and field == STORED_SOURCE_TOPIC:
            _skip_text(buf, &at, end)
        else:
            _skip(buf, &at, end, wire, field, 0)
    own = () if fields.headers is None else tuple(fields.headers)
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
