# cython: language_level=3, boundscheck=False, wraparound=False
"""The timers of a ``Future`` or ``FutureBatch`` record read into columns: compiled.

:mod:`futures.worker.columns` decides which records take this path and checks the timers
it reads; this reads them, for every timer of every batch record, so it is compiled: the
protobuf wire format is walked once, with no message object per timer.

A timer's stored bytes are its ``Future``'s own bytes, as the record holds them: protobuf
fields concatenate, so the ``StoredTimer`` is the ``future`` field (tag, length, those bytes)
followed by the record's other fields (``tail``), and a timer without an id gets its derived
one as a field appended to its ``Future`` (the last value of a field wins). They read back as
the ``StoredTimer`` the general parser builds (tests/worker/test_columns.py).

It reads only what it can vouch for: a timer without ``due_ms``, a recurring one, a known
field with another wire type, anything protobuf refuses (``ktimers/protowire.pxd``: a
truncated field, text that is not UTF-8 …) — and the record is left to the general parser
(None). Unknown fields of every wire type, groups among them, are skipped and stored with the
timer as protobuf keeps them. A ``Future`` is read at the depth its ``StoredTimer`` holds it
(one level down), so what it stores nests no deeper than protobuf reads back.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcpy

from futures.ingress.framing import MAGIC_BYTE
from ktimers.protowire cimport *
from ktimers.wire import IDS_HEADER, IDS_NEW, KIND_BATCH, KIND_FUTURE, KIND_HEADER

# A framed record's first byte (futures.ingress.framing.is_framed, read here as a C char).
cdef char _MAGIC = MAGIC_BYTE

# The tags of StoredTimer.future, of StoredTimer.source_offset and of Future.id (field << 3 | wire type).
cdef enum:
    STORED_FUTURE_TAG = 0x0A
    SOURCE_OFFSET_TAG = 0x18
    FUTURE_ID_TAG = 0x22


# One ``Future`` read: where its callback topic and id are, and its due time.
cdef struct Read:
    Py_ssize_t topic_at
    Py_ssize_t topic_size
    Py_ssize_t id_at
    Py_ssize_t id_size
    bint has_due
    int64_t due_ms


cdef int _header(const unsigned char* buf, Py_ssize_t at, Py_ssize_t end, int depth) noexcept nogil:
    cdef uint64_t field
    cdef int wire
    cdef Py_ssize_t size
    while at < end:
        wire = read_tag(buf, &at, end, &field)
        if wire < 0:
            return -1
        if field == HEADER_KEY or field == HEADER_VALUE:
            if wire != LEN:
                return -1
            size = read_length(buf, &at, end)
            if size < 0 or (field == HEADER_KEY and not is_utf8(buf + at, size)):
                return -1
            at += size
        elif skip_field(buf, &at, end, wire, field, depth) < 0:
            return -1
    return 0


cdef int _future(const unsigned char* buf, Py_ssize_t at, Py_ssize_t end, Read* read) noexcept nogil:
    """Read the ``Future`` in ``buf[at:end]``: 0, or -1 where it is not this path's. Its depth
    is its ``StoredTimer``'s field's (1), whether it is a record's value or a batch's element."""
    cdef uint64_t field, number = 0
    cdef int wire
    cdef Py_ssize_t size
    read.topic_at = read.topic_size = read.id_at = read.id_size = 0
    read.has_due = False
    read.due_ms = 0
    while at < end:
        wire = read_tag(buf, &at, end, &field)
        if wire < 0:
            return -1
        if field == FUTURE_DUE_MS:
            if wire != VARINT or read_varint(buf, &at, end, &number) < 0:
                return -1
            read.has_due = True
            read.due_ms = <int64_t>number
        elif FUTURE_TOPIC <= field <= FUTURE_HEADERS:
            if wire != LEN:
                return -1
            size = read_length(buf, &at, end)
            if size < 0:
                return -1
            if field == FUTURE_HEADERS:
                if _header(buf, at, at + size, 2) < 0:
                    return -1
            elif field != FUTURE_VALUE and not is_utf8(buf + at, size):
                return -1
            if field == FUTURE_TOPIC:
                read.topic_at, read.topic_size = at, size
            elif field == FUTURE_ID:
                read.id_at, read.id_size = at, size
            at += size
        elif field == FUTURE_RECURRENCE:
            return -1  # a series: its recurrence is checked on the general path
        elif skip_field(buf, &at, end, wire, field, 1) < 0:
            return -1
    return 0


cdef bytes _stored(const unsigned char* future, Py_ssize_t size, bytes derived_id, const char* tail, Py_ssize_t tail_size):
    """The ``StoredTimer`` bytes of a ``Future``: its field (with the derived id appended, if
    any), then ``tail``."""
    cdef Py_ssize_t inner = size + (0 if derived_id is None else len_field_size(PyBytes_GET_SIZE(derived_id)))
    cdef bytes stored = PyBytes_FromStringAndSize(NULL, len_field_size(inner) + tail_size)
    cdef char* out = PyBytes_AS_STRING(stored)
    # The field's bytes are the Future's and the derived id's field: its tag and length, then each.
    out[0] = STORED_FUTURE_TAG
    out = put_varint(out + 1, inner)
    memcpy(out, future, size)
    out += size
    if derived_id is not None:
        out = put_len_field(out, FUTURE_ID_TAG, PyBytes_AS_STRING(derived_id), PyBytes_GET_SIZE(derived_id))
    memcpy(out, tail, tail_size)
    return stored


cdef bytes _tail(bytes before, int64_t offset, bytes after):
    """The ``StoredTimer`` fields after ``future``: ``before``, ``source_offset`` (left out when
    0, protobuf's default), ``after``."""
    cdef Py_ssize_t size = PyBytes_GET_SIZE(before), after_size = PyBytes_GET_SIZE(after)
    cdef char field[11]  # the tag and a varint of at most ten bytes
    cdef Py_ssize_t field_size = 0
    if offset != 0:
        field[0] = SOURCE_OFFSET_TAG
        field_size = put_varint(field + 1, <uint64_t>offset) - field
    cdef bytes tail = PyBytes_FromStringAndSize(NULL, size + field_size + after_size)
    cdef char* out = PyBytes_AS_STRING(tail)
    memcpy(out, PyBytes_AS_STRING(before), size)
    memcpy(out + size, field, field_size)
    memcpy(out + size + field_size, PyBytes_AS_STRING(after), after_size)
    return tail


cdef tuple _request_headers(headers):
    """``kt-kind``'s and ``kt-ids``'s last values among ``headers`` (None where absent), in one
    pass: both are read for every record."""
    cdef object kind = None, ids = None
    for name, value in headers:
        if name == KIND_HEADER:
            kind = value
        elif name == IDS_HEADER:
            ids = value
    return kind, ids


cdef class _Columns:
    """The columns :func:`read_records` fills, timer by timer."""

    cdef list sources, ids, id_bytes, dues, topics, stored
    cdef dict topic_names  # timers mostly share a callback topic: one string for it
    cdef Py_ssize_t longest, largest

    def __cinit__(self):
        self.sources, self.ids, self.id_bytes, self.dues, self.topics, self.stored = [], [], [], [], [], []
        self.topic_names = {}
        self.longest = self.largest = 0

    cdef Py_ssize_t count(self):
        return len(self.ids)

    cdef void truncate(self, Py_ssize_t count, Py_ssize_t longest, Py_ssize_t largest):
        """Forget the timers past the first ``count`` (a record this path does not read whole),
        and what they made of the longest id and the largest timer (``longest`` and ``largest``
        before them): the checks of the records read judge those records only."""
        del self.sources[count:], self.ids[count:], self.id_bytes[count:]
        del self.dues[count:], self.topics[count:], self.stored[count:]
        self.longest, self.largest = longest, largest

    cdef int read(self, bytes value, bint batch, bytes fields, derive, record) except -2:
        """Append the timers of ``value`` (a ``FutureBatch`` if ``batch``, else a ``Future``) of
        ``record``, each stored with ``fields`` after it; their number, or -1 when a timer is not
        this path's (the module docstring: what it appended of the record is then to be dropped)."""
        cdef const unsigned char* buf = <const unsigned char*>PyBytes_AS_STRING(value)
        cdef Py_ssize_t end = PyBytes_GET_SIZE(value)
        cdef Py_ssize_t at = 0, start, size, whole, read_count = 0
        cdef uint64_t field
        cdef int wire
        cdef Read read
        cdef bytes encoded, derived, raw_topic
        cdef str timer_id
        cdef const char* after = PyBytes_AS_STRING(fields)
        cdef Py_ssize_t after_size = PyBytes_GET_SIZE(fields)
        while at < end:
            if batch:
                wire = read_tag(buf, &at, end, &field)
                if wire < 0:
                    return -1
                if field != BATCH_FUTURES:
                    if skip_field(buf, &at, end, wire, field, 0) < 0:
                        return -1
                    continue
                if wire != LEN:
                    return -1
                size = read_length(buf, &at, end)
                if size < 0:
                    return -1
                start = at
                at += size
            else:
                start, size, at = 0, end, end
            if _future(buf, start, start + size, &read) < 0 or not read.has_due:
                return -1
            if read.id_size:
                encoded = PyBytes_FromStringAndSize(<const char*>buf + read.id_at, read.id_size)
                timer_id = encoded.decode("utf-8")
                derived = None
            else:
                timer_id = derive(record, read_count if batch else None)
                encoded = derived = timer_id.encode("utf-8")
            timer = _stored(buf + start, size, derived, after, after_size)
            raw_topic = PyBytes_FromStringAndSize(<const char*>buf + read.topic_at, read.topic_size)
            topic = self.topic_names.get(raw_topic)
            if topic is None:
                topic = self.topic_names[raw_topic] = raw_topic.decode("utf-8")
            self.sources.append(record)
            self.ids.append(timer_id)
            self.id_bytes.append(encoded)
            self.dues.append(read.due_ms)
            self.topics.append(topic)
            self.stored.append(timer)
            read_count += 1
            if len(encoded) > self.longest:
                self.longest = len(encoded)
            whole = len(encoded) + len(timer)
            if whole > self.largest:
                self.largest = whole
        return read_count

    cdef tuple result(self):
        return self.sources, self.ids, self.id_bytes, self.dues, self.topics, self.stored, self.longest, self.largest


def read_records(list records not None, Py_ssize_t max_timers, tuple tail not None, derive):
    """The timers of the first ``records`` (native request records of one partition, in order)
    as columns, and where they end.

    The columns: the record of each timer, the timers' ids, ids UTF-8 encoded, due times,
    callback topics and ``StoredTimer`` bytes, then the longest id's bytes, the largest id
    and stored bytes together, and whether the records say their ids are new (``kt-ids: new``);
    None when the first record is not read. Where they end: the index of the first record
    not read, one that is framed (:func:`is_framed`), whose ``kt-kind`` names neither a
    ``Future`` nor a ``FutureBatch``, whose ``kt-ids`` says otherwise than the first record's,
    that holds no timer or one not this path's (the module docstring), or that comes once
    ``max_timers`` are read.

    ``tail``: the ``StoredTimer`` fields before and after ``source_offset`` (the record's
    offset), which follow ``future``; ``derive(record, index)``: the id of a timer of ``record``
    without one (``index`` None for a single ``Future``).
    """
    cdef _Columns columns = _Columns()
    cdef Py_ssize_t i, before, read_count, longest, largest
    cdef bytes value
    cdef bytes before_fields = tail[0], after_fields = tail[1]
    cdef Py_ssize_t stop = len(records)
    cdef bint new_ids = False, record_new
    for i in range(stop):
        if i > 0 and columns.count() >= max_timers:
            break
        record = records[i]
        value = record.value
        if value is None or PyBytes_GET_SIZE(value) == 0 or PyBytes_AS_STRING(value)[0] == _MAGIC:
            break
        kind, ids = _request_headers(record.headers) if record.headers else (None, None)
        if kind is not None and kind != KIND_FUTURE and kind != KIND_BATCH:
            break
        record_new = ids == IDS_NEW
        if i == 0:
            new_ids = record_new
        elif record_new != new_ids:
            break  # a run's ids are all new or none is: the lookup is skipped or made for all
        before, longest, largest = columns.count(), columns.longest, columns.largest
        read_count = columns.read(
            value, kind == KIND_BATCH, _tail(before_fields, record.offset, after_fields), derive, record
        )
        if read_count <= 0:
            columns.truncate(before, longest, largest)
            break
    else:
        i = stop
    if columns.count() == 0:
        return None, i
    return (*columns.result(), new_ids), i
