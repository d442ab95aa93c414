# cython: language_level=3, boundscheck=False, wraparound=False
"""A bounded read of a partition table's due timers: compiled.

Every fired timer is read by :meth:`~futures.worker.table.PartitionTimers.due_items` twice in
second mode (its callback built ahead of the tick, then the tick's scan) and once in precise
mode; taking each item off RocksDB's iterator in the interpreter, with its count and bytes,
costs a few dozen bytecodes a timer.
"""

def take_due(items, Py_ssize_t max_count, max_bytes):
    """Up to ``max_count`` ``(key, value)`` pairs (bytes) of the iterator ``items``, in order;
    with ``max_bytes`` (not None), up to the first whose values reach it (at least one).
    Nothing past that is read from ``items``: an item read is an item held."""
    cdef list found = []
    cdef tuple item
    cdef bint bounded = max_bytes is not None
    cdef Py_ssize_t room = max_bytes if bounded else 0
    if max_count <= 0:
        return found
    for item in items:
        found.append(item)
        if bounded:
            room -= len(item[1])
            if room <= 0:
                break
        if len(found) >= max_count:
            break
    return found
