# cython: language_level=3, boundscheck=False, wraparound=False
"""Changelog records into one RocksDB write batch of a partition table: compiled.

:meth:`futures.worker.table.PartitionTimers.apply` writes every change of a table (an
ingest step, a firing, a sweep, a replay of the changelog) through :func:`fill`, which
turns the records into the batch's operations in one pass: a timer's put and its id
index entry, a tombstone and the index entry it leaves stale, an ``f`` record and the
timers it lists, the progress records. It runs once per timer accepted, fired and
swept; in the interpreter it was about a tenth of a timer's ingest (``make bench-engine``).
It names the key spaces it reads; :mod:`futures.worker.table` describes them all.
"""

import struct

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE

from futures.worker.fired_keys import unpack_keys
from futures.worker.table_read import keys_between

# The key spaces a write reads (the table of keys: futures/worker/table.py's docstring).
TIMER_PREFIX = b"t"
FIRED_PREFIX = b"f"
INDEX_PREFIX = b"i"
PROGRESS_KEY = b"m:progress"
TOPIC_PROGRESS_PREFIX = b"m:progress:"

cdef object _I64 = struct.Struct(">q")
cdef object _PROGRESS = struct.Struct(">qq")
cdef object _U64 = struct.Struct(">Q")

cdef bytes _TIMER = TIMER_PREFIX
cdef bytes _FIRED = FIRED_PREFIX
cdef bytes _INDEX = INDEX_PREFIX
cdef bytes _PROGRESS_KEY = PROGRESS_KEY
cdef bytes _TOPIC_PROGRESS = TOPIC_PROGRESS_PREFIX
#: Where the id starts in a timer key (after TIMER_PREFIX and the 8-byte due time).
cdef Py_ssize_t _ID_AT = len(TIMER_PREFIX) + 8
#: Fired timers an ``f`` record lists at least for them to be deleted by one range tombstone.
RANGE_MIN_KEYS = 16
cdef Py_ssize_t _RANGE_MIN_KEYS = RANGE_MIN_KEYS


cdef inline bint _starts(bytes key, bytes prefix):
    cdef Py_ssize_t size = PyBytes_GET_SIZE(prefix)
    return PyBytes_GET_SIZE(key) >= size and PyBytes_AS_STRING(key)[:size] == PyBytes_AS_STRING(prefix)[:size]


cdef class _Write:
    """What one write knows while its records are read."""

    cdef object batch
    cdef object db
    cdef object ids
    cdef bint replay
    cdef Py_ssize_t delta
    # Whether each timer key exists once the records so far are applied (replay only): the
    # batch is not readable before it is written, and a replay batch may put and delete (or
    # put twice) the same key.
    cdef dict present
    # Index entries this write puts (index key → due bytes): a tombstone of an id's other
    # version leaves the entry alone (a series' next occurrence is put before the current
    # one's tombstone, a new version may be put before the old one's).
    cdef dict indexed
    cdef list unindexed
    # Timer keys this write puts (live): a range tombstone later in the batch would delete them.
    cdef list put_keys

    def __cinit__(self, batch, db, ids, bint replay, list unindexed):
        self.batch = batch
        self.db = db
        self.ids = ids
        self.replay = replay
        self.delta = 0
        self.present = {}
        self.indexed = {}
        self.unindexed = unindexed
        self.put_keys = []

    cdef void delete_fired(self, list listed) except *:
        """Delete the fired timers ``listed`` (live): with one range tombstone where they are all
        the table holds from the first to the last, else one tombstone each.

        A firing's timers lie together in due order, and a tombstone each is a random insert
        into the memtable, flushed and compacted later. The table is read to be sure of the
        range: a timer it holds between them (kept for a retry, accepted late, a precise
        window's not yet sent), or put earlier in this write, keeps them apart.
        """
        cdef Py_ssize_t count = len(listed)
        cdef bytes first, last, key
        if count >= _RANGE_MIN_KEYS:
            first, last = listed[0], listed[count - 1]
            if keys_between(self.db, first, last, count + 1) == listed:
                for key in self.put_keys:
                    if first <= key <= last:
                        break
                else:
                    self.batch.delete_range(first, last + b"\x00")  # to the key right after ``last``
                    return
        delete = self.batch.delete
        for key in listed:
            delete(key)

    cdef bint _exists(self, bytes key):
        existed = self.present.get(key)
        if existed is None:
            return self.db.get(key) is not None
        return existed

    cdef void delete_timer(self, bytes key) except *:
        # A timer key is TIMER_PREFIX, the due time (8 bytes) and the id: its index entry is the
        # id's, holding those 8 bytes. Sliced, not decoded.
        cdef bytes index_key = _INDEX + key[_ID_AT:]
        if self.replay:
            self.delta -= self._exists(key)
            self.present[key] = False
        self.batch.delete(key)
        points_at = self.indexed.get(index_key)
        if points_at is None and self.replay:
            # The put may be in an earlier batch of the same write.
            raw = self.ids.get(index_key)
            points_at = None if raw is None else bytes(raw)
        if points_at is None or points_at == key[1:_ID_AT]:
            self.unindexed.append(index_key)
            self.indexed.pop(index_key, None)


def fill(batch, db, ids, ids_cf, records, bint replay, bytes below, low, stale_index, topic_offset,
         watermark, request_offset, fired_seq):
    """Put the operations of ``records`` (changelog records, in order) into ``batch`` for
    ``db``, a partition table, and the index entries they change after them into its column
    family ``ids`` (``ids_cf``: its handle, for the batch), in the same final state as the
    records applied one by one.

    ``replay``: the records come from the changelog, so each is checked against the table (the
    count of pending timers changes by what it finds; an ``f`` record deletes the timers it
    lists and their index entries); live, the caller knows the count and a fired timer's index
    entry waits for the sweep. ``below``: a timer put below this key lowers ``low``, the earliest
    due time at or below the watermark. ``stale_index``: index entries deleted too.
    ``topic_offset(topic)``: the table's last applied offset of another ingress topic.

    Returns ``(delta, low, watermark, request_offset, topic_offsets, fired_seq)``: the change in
    pending timers (replay), and what the records move.
    """
    cdef _Write write = _Write(batch, db, ids, replay, list(stale_index))
    cdef dict indexed = write.indexed
    cdef dict topic_offsets = {}
    cdef bytes key, index_key
    cdef object value
    put, delete = batch.put, batch.delete
    for key, value in records:
        if _starts(key, _TIMER):
            if value is None:
                write.delete_timer(key)
                continue
            index_key = _INDEX + key[_ID_AT:]
            if replay:
                write.delta += 1 - write._exists(key)
                write.present[key] = True
            put(key, value)
            indexed[index_key] = key[1:_ID_AT]
            if not replay:
                write.put_keys.append(key)
            if key < below:
                due = _U64.unpack_from(key, PyBytes_GET_SIZE(_TIMER))[0]
                low = due if low is None else min(low, due)
        elif _starts(key, _FIRED):
            if value is None:
                delete(key)  # swept: every timer it listed has its own tombstone
                continue
            put(key, value)  # for the sweep
            if replay:
                for timer_key in unpack_keys(value):
                    write.delete_timer(timer_key)
            else:
                # Live, the timers only: their index entries, no longer valid (dues_of_ids),
                # go when the sweep takes this record.
                write.delete_fired(unpack_keys(value))
            seq = _U64.unpack_from(key, PyBytes_GET_SIZE(_FIRED))[0]
            fired_seq = max(fired_seq, seq + 1)
        elif key == _PROGRESS_KEY and value is not None:
            record_watermark, record_offset = _PROGRESS.unpack(value)
            watermark = max(watermark, record_watermark)
            request_offset = max(request_offset, record_offset)
        elif _starts(key, _TOPIC_PROGRESS) and value is not None:
            topic = key[PyBytes_GET_SIZE(_TOPIC_PROGRESS):].decode()
            record_offset = _I64.unpack(value)[0]
            known = topic_offsets.get(topic)
            if known is None:
                known = topic_offset(topic)
            topic_offsets[topic] = max(known, record_offset)
    for index_key in write.unindexed:
        delete(index_key, ids_cf)
    for index_key, points_at in indexed.items():
        put(index_key, points_at, ids_cf)
    return write.delta, low, watermark, request_offset, topic_offsets, fired_seq
