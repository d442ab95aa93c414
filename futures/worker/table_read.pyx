# cython: language_level=3, boundscheck=False, wraparound=False
"""Bounded reads of a partition table: compiled.

Every fired timer is read by :meth:`~futures.worker.table.PartitionTimers.due_items` twice in
second mode (its callback built ahead of the tick, then the tick's scan) and once in precise
mode; taking each item off RocksDB's iterator in the interpreter, with its count and bytes,
costs a few dozen bytecodes a timer. :func:`keys_between` reads the keys of a range, for a
firing's write and for the sweep.
"""

from itertools import islice

from rocksdict import ReadOptions


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


def keys_between(db, bytes first, bytes last, Py_ssize_t most):
    """The keys ``db`` holds from ``first`` to ``last`` (both included), in order, ``most`` at
    most: RocksDB stops at the bound and steps over deleted keys without a call into Python."""
    bounded = ReadOptions()
    bounded.set_iterate_upper_bound(last + b"\x00")  # the key right after ``last``
    return list(islice(db.keys(from_key=first, read_opt=bounded), most))
