# cython: language_level=3, boundscheck=False, wraparound=False
"""A piece of fired timers, turned into what the worker records of it: compiled.

Once a piece's callbacks are delivered, the dispatcher records their ``FIRED`` events column
by column per partition, with each one's lateness (:func:`fired_columns`), and the firing
lists their table keys per partition for the ``f`` records that delete them
(:func:`keys_by_partition`). Both run once per fired timer; in the interpreter their loops
were a tenth of what firing a timer cost the engine (``make bench-engine``).
"""

#: The fields of a ``Callback`` read here (up to its source offset).
cdef Py_ssize_t _FIELDS = 8
#: A ``Callback``'s fields by place, as it declares them.
cdef Py_ssize_t _KEY = 0, _PARTITION = 1, _TIMER_ID = 5, _DUE_MS = 6, _SOURCE_OFFSET = 7, _OCCURRENCE = 12


cdef inline tuple _callback(object callback):
    if not isinstance(callback, tuple) or len(<tuple>callback) < _FIELDS:
        raise TypeError(f"a Callback is needed, not {type(callback).__name__}")
    return <tuple>callback


def fired_columns(list callbacks, list fired):
    """The ``FIRED`` columns of ``callbacks`` — per partition, in their order: ids, due times
    and source offsets — and each one's lateness in ms, by ``fired`` (each one's dispatch time,
    epoch ms; 0 for a timer sent before it was due, which no callback is)."""
    if len(fired) != len(callbacks):
        raise ValueError(f"{len(callbacks)} callbacks but {len(fired)} dispatch times")
    cdef dict columns = {}
    cdef list lateness = []
    cdef tuple c, column
    cdef Py_ssize_t i
    for i in range(len(callbacks)):
        c = _callback(callbacks[i])
        partition = c[_PARTITION]
        column = columns.get(partition)
        if column is None:
            column = ([], [], [])
            columns[partition] = column
        due_ms = c[_DUE_MS]
        (<list>column[0]).append(c[_TIMER_ID])
        (<list>column[1]).append(due_ms)
        (<list>column[2]).append(c[_SOURCE_OFFSET])
        at = fired[i]
        lateness.append(at - due_ms if at > due_ms else 0)
    return columns, lateness


def keys_by_partition(list callbacks):
    """The table keys of ``callbacks`` per partition, in their order, and those of them that are
    an occurrence of a recurring timer (whose next occurrence is armed as they are deleted)."""
    cdef dict keys = {}
    cdef list recurring = []
    cdef list of_partition
    cdef tuple c
    for callback in callbacks:
        c = _callback(callback)
        partition = c[_PARTITION]
        of_partition = keys.get(partition)
        if of_partition is None:
            of_partition = []
            keys[partition] = of_partition
        of_partition.append(c[_KEY])
        if len(c) > _OCCURRENCE and c[_OCCURRENCE]:
            recurring.append(callback)
    return keys, recurring
