# The protobuf wire format (https://protobuf.dev/programming-guides/encoding/) in C, for the
# worker's compiled modules: read by prepare.pyx (stored timers) and future_columns.pyx
# (requests), written by the latter.
# Inline functions over a buffer and a position; each reader returns -1 where protobuf would
# refuse the bytes, and leaves it to its caller to say so. What protobuf refuses is what its
# Python parser (upb) refuses: a varint of more than ten bytes; a tag or a length of more
# than five, a tag past 32 bits, a length from 2**31 - 1; field number 0; wire types 6 and 7;
# a truncated field; an end-group that closes no group, or another field's; messages and
# groups nested more than MAX_DEPTH levels deep. A group is an unknown field like any other.
# Each reader is fuzzed against protobuf's parser: tests/worker/test_prepare.py,
# tests/worker/test_columns.py.

from libc.stdint cimport uint32_t, uint64_t
from libc.string cimport memcpy

cdef enum:
    VARINT = 0
    I64 = 1
    LEN = 2
    START_GROUP = 3
    END_GROUP = 4
    I32 = 5
    # Protobuf's nesting limit: a message or a group may lie this many levels below the message
    # parsed, no deeper (upb's kUpb_WireFormat_DefaultDepthLimit, which Python's parser uses).
    MAX_DEPTH = 100

# The field numbers read, of proto/timers.proto.
cdef enum:
    STORED_FUTURE = 1  # StoredTimer.future
    STORED_SOURCE_OFFSET = 3  # StoredTimer.source_offset
    STORED_SOURCE_TOPIC = 5  # StoredTimer.source_topic
    BATCH_FUTURES = 1  # FutureBatch.futures
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
    RECURRENCE_CRON = 1  # Recurrence.cron
    RECURRENCE_TIME_ZONE = 2  # Recurrence.time_zone
    RECURRENCE_ORDINAL = 6  # Recurrence.ordinal


cdef inline int read_varint(const unsigned char* buf, Py_ssize_t* at, Py_ssize_t end, uint64_t* out) noexcept nogil:
    """The varint at ``at`` into ``out``, ``at`` moved past it: 0, or -1 (truncated, over ten
    bytes). What a tenth byte holds past the 64th bit is dropped, as protobuf drops it."""
    cdef uint64_t result = 0
    cdef int shift = 0
    cdef Py_ssize_t i = at[0]
    cdef unsigned char byte
    while True:
        if i >= end or shift > 63:
            return -1
        byte = buf[i]
        i += 1
        result |= (<uint64_t>(byte & 0x7F)) << shift
        shift += 7
        if not byte & 0x80:
            break
    at[0] = i
    out[0] = result
    return 0


cdef inline Py_ssize_t read_length(const unsigned char* buf, Py_ssize_t* at, Py_ssize_t end) noexcept nogil:
    """A length-delimited field's length, or -1: it runs past ``end``, or its varint is longer
    than five bytes or its value 2**31 - 1 or more, which protobuf refuses."""
    cdef uint64_t n
    cdef Py_ssize_t start = at[0]
    if read_varint(buf, at, end, &n) < 0 or at[0] - start > 5 or n >= 0x7FFFFFFF or n > <uint64_t>(end - at[0]):
        return -1
    return <Py_ssize_t>n


cdef inline int read_tag(const unsigned char* buf, Py_ssize_t* at, Py_ssize_t end, uint64_t* field) noexcept nogil:
    """The next field's number into ``field``; its wire type (0-5), or -1: a tag of more than
    five bytes or 32 bits, field number 0, wire types 6 and 7."""
    cdef uint64_t tag
    cdef Py_ssize_t start = at[0]
    if read_varint(buf, at, end, &tag) < 0 or at[0] - start > 5 or tag >> 32:
        return -1
    field[0] = tag >> 3
    if field[0] == 0 or (tag & 7) > I32:
        return -1
    return <int>(tag & 7)


cdef inline int skip_value(const unsigned char* buf, Py_ssize_t* at, Py_ssize_t end, int wire) noexcept nogil:
    """``at`` moved past a value of a wire type other than the groups': 0, or -1 (truncated,
    or a group's)."""
    cdef uint64_t ignored
    cdef Py_ssize_t size
    if wire == VARINT:
        return read_varint(buf, at, end, &ignored)
    if wire == LEN:
        size = read_length(buf, at, end)
        if size < 0:
            return -1
    elif wire == I64:
        size = 8
    elif wire == I32:
        size = 4
    else:
        return -1
    if size > end - at[0]:
        return -1
    at[0] += size
    return 0


cdef inline int skip_field(const unsigned char* buf, Py_ssize_t* at, Py_ssize_t end, int wire, uint64_t field, int depth) noexcept nogil:
    """``at`` moved past the value of field ``field`` (wire type ``wire``) of a message ``depth``
    levels below the one parsed (0: that one): 0, or -1 (truncated, an end-group, which closes
    no group of the message, or a group unclosed, closed by another field's end-group or nested
    past MAX_DEPTH).

    A group runs to the end-group of its own field number; groups nest, each a level deeper.
    No message of ours has one: it is an unknown field, skipped as protobuf skips it."""
    cdef uint32_t open_groups[MAX_DEPTH]
    cdef int count
    cdef uint64_t inner
    if wire != START_GROUP:
        return skip_value(buf, at, end, wire)
    if depth >= MAX_DEPTH:
        return -1
    open_groups[0] = <uint32_t>field
    count = 1
    while count > 0:
        wire = read_tag(buf, at, end, &inner)
        if wire < 0:
            return -1
        if wire == END_GROUP:
            if inner != open_groups[count - 1]:
                return -1
            count -= 1
        elif wire == START_GROUP:
            if depth + count >= MAX_DEPTH:
                return -1
            open_groups[count] = <uint32_t>inner
            count += 1
        elif skip_value(buf, at, end, wire) < 0:
            return -1
    return 0


cdef inline bint is_utf8(const unsigned char* s, Py_ssize_t n) noexcept nogil:
    """Whether ``s`` is UTF-8 as protobuf requires of a string field (and Python's strict codec
    decodes): no overlong forms, no surrogates, nothing past U+10FFFF."""
    cdef Py_ssize_t i = 0, j
    cdef unsigned char c, low, high
    cdef int more
    while i < n:
        c = s[i]
        if c < 0x80:
            i += 1
            continue
        low, high = 0x80, 0xBF
        if 0xC2 <= c <= 0xDF:
            more = 1
        elif 0xE0 <= c <= 0xEF:
            more = 2
            if c == 0xE0:
                low = 0xA0  # overlong
            elif c == 0xED:
                high = 0x9F  # surrogates
        elif 0xF0 <= c <= 0xF4:
            more = 3
            if c == 0xF0:
                low = 0x90  # overlong
            elif c == 0xF4:
                high = 0x8F  # past U+10FFFF
        else:
            return False
        if n - i <= more:
            return False
        if not low <= s[i + 1] <= high:
            return False
        for j in range(i + 2, i + 1 + more):
            if not 0x80 <= s[j] <= 0xBF:
                return False
        i += 1 + more
    return True


cdef inline Py_ssize_t varint_size(uint64_t n) noexcept nogil:
    """The bytes of ``n`` as a varint."""
    cdef Py_ssize_t size = 1
    while n >= 0x80:
        n >>= 7
        size += 1
    return size


cdef inline char* put_varint(char* out, uint64_t n) noexcept nogil:
    """``n`` as a varint at ``out``; where it ends."""
    while n >= 0x80:
        out[0] = <char>((n & 0x7F) | 0x80)
        out += 1
        n >>= 7
    out[0] = <char>n
    return out + 1


cdef inline Py_ssize_t len_field_size(Py_ssize_t size) noexcept nogil:
    """The bytes of a length-delimited field of ``size`` bytes, its tag one byte (fields 1-15)."""
    return 1 + varint_size(size) + size


cdef inline char* put_len_field(char* out, unsigned char tag, const char* data, Py_ssize_t size) noexcept nogil:
    """A length-delimited field at ``out``: ``tag``, ``size`` as a varint, then ``size`` bytes of
    ``data``; where it ends."""
    out[0] = <char>tag
    out = put_varint(out + 1, size)
    memcpy(out, data, size)
    return out + size
