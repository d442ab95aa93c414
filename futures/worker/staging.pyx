# cython: language_level=3, boundscheck=False, wraparound=False
"""Valid timers staged into an ingest step's changes: compiled.

:meth:`futures.worker.ingest.Ingest._schedule` stages every accepted timer, of a
``FutureBatch`` or of a run of one-``Future`` records, through :func:`stage`: its
table key, its changelog record, its version in the step's overlay (latest wins), and
the record that removes the version it replaces. In the interpreter this loop was a
tenth of what a timer cost at ingest (``make bench-engine``); here each timer is a few
list and dict operations and one key built in place.

It stops, for the caller, where a timer asks for more than staging: a timer due too
long ago to accept (the caller refuses it, then stages on from the next one), and in
precise mode every ``pause_every`` timers (the caller lets the windows send).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.string cimport memcpy

from futures.worker.table_write import TIMER_PREFIX

#: How a call of :func:`stage` ended.
STAGED = 0  # every timer from ``start`` on is staged
REFUSE = 1  # at a timer too late to accept: the caller refuses it, then stages on from the next
PAUSE = 2  # precise mode: ``pause_every`` timers staged, the caller lets the windows send

cdef bytes _PREFIX = TIMER_PREFIX
cdef object _ABSENT = object()


cdef bytes _key(bytes encoded, unsigned long long due_ms):
    """The table key: TIMER_PREFIX, the due time (8 bytes, big-endian), the id's bytes
    (:func:`futures.worker.table.table_key`)."""
    cdef Py_ssize_t head = PyBytes_GET_SIZE(_PREFIX), size = PyBytes_GET_SIZE(encoded), i
    cdef bytes key = PyBytes_FromStringAndSize(NULL, head + 8 + size)
    cdef unsigned char *out = <unsigned char *>PyBytes_AS_STRING(key)
    memcpy(out, PyBytes_AS_STRING(_PREFIX), head)
    for i in range(8):
        out[head + i] = (due_ms >> (56 - 8 * i)) & 0xFF
    memcpy(out + head + 8, PyBytes_AS_STRING(encoded), size)
    return key


def stage(
    timers,
    list in_table,
    Py_ssize_t start,
    changes,
    windows,
    int partition,
    long long late_ms,
    long long now_ms,
    double max_lateness_s,
    bint refuse_late,
    Py_ssize_t staged,
    Py_ssize_t pause_every,
):
    """Stage ``timers`` (columns of one partition's timers) from ``start`` into ``changes``.

    ``in_table``: each timer's due time in the table (None: none), looked up before the
    step changed anything; versions staged earlier in the step are in ``changes.overlay``.
    A timer due at or below ``late_ms`` (the partition's watermark) is accepted late, unless
    ``refuse_late`` and it is more than ``max_lateness_s`` older than ``now_ms``.
    ``windows``: precise mode's, told of every version replaced, and offered what is put
    (or None). ``staged`` counts the step's requests; with ``windows``, the call returns
    each time it reaches a multiple of ``pause_every``.

    Returns ``(next, staged, pending_delta, late, ended)``: the index to go on from (for
    :data:`REFUSE`, the timer to refuse, its older version already removed), the count,
    the change in pending timers, whether a timer was accepted late, and how it ended.
    """
    cdef list ids = timers.ids
    cdef list id_bytes = timers.id_bytes
    cdef list dues = timers.due_ms
    cdef list stored = timers.stored
    cdef dict overlay = changes.overlay
    cdef list records = changes.records
    cdef list offers = changes.offers
    cdef bint precise = windows is not None
    cdef bint late = False
    cdef Py_ssize_t i, n = len(ids), delta = 0
    cdef unsigned long long due_ms
    cdef bytes encoded, new_key, old_key, value
    cdef object timer_id, due, old_due
    for i in range(start, n):
        timer_id = ids[i]
        due = dues[i]
        due_ms = due
        encoded = id_bytes[i]
        old_due = overlay.get(timer_id, _ABSENT)
        if old_due is _ABSENT:
            old_due = in_table[i]
        new_key = _key(encoded, due_ms)
        if old_due is not None:
            old_key = _key(encoded, old_due)
            if precise:
                windows.withdraw(partition, old_due, old_key)
            if old_key != new_key:
                # Latest wins: the older version is removed, not fired.
                records.append((old_key, None))
                overlay[timer_id] = None
                delta -= 1
                old_due = None
        staged += 1
        if late_ms >= 0 and due_ms <= <unsigned long long>late_ms:
            # As (now - due) / 1000 in Python: both are exact in a double below 2**53.
            if refuse_late and (<double>now_ms - <double>due_ms) / 1000.0 > max_lateness_s:
                return i, staged, delta, late, REFUSE
            late = True
        value = stored[i]
        records.append((new_key, value))
        overlay[timer_id] = due
        if precise:
            offers.append((timer_id, due, new_key, value))
        if old_due is None:
            delta += 1
        if precise and staged % pause_every == 0:
            return i + 1, staged, delta, late, PAUSE
    return n, staged, delta, late, STAGED
