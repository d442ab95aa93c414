# cython: language_level=3, boundscheck=False, wraparound=False
"""Second mode's callbacks built ahead of their tick, and taken at it: compiled.

:class:`~futures.worker.lookahead.Lookahead` builds the callbacks of a partition's next second
while the worker waits for its tick (:meth:`BuiltAhead.fill`), and the tick's scan takes them
(:meth:`BuiltAhead.take`): every fired timer passes through both, a few dozen bytecodes each
way in the interpreter.

A timer whose bytes :func:`~futures.worker.prepare.prepare` refuses is not built ahead, and
at the tick it is handed back to the firing (``refused``), which dead-letters it alone.
"""

from google.protobuf.message import DecodeError

from futures.worker.context import callback_bytes
from futures.worker.prepare import prepare


cdef class BuiltAhead:
    """Callbacks by partition and table key, each with the stored timer it was built from and
    the bytes both hold (counted once, when built)."""

    cdef dict _ready
    #: Callbacks held.
    cdef readonly Py_ssize_t count
    #: Bytes they and their stored timers hold (:func:`~futures.worker.context.callback_bytes`).
    cdef readonly Py_ssize_t held

    def __cinit__(self):
        self._ready = {}

    def partitions(self):
        """The partitions with callbacks held."""
        return list(self._ready)

    def drop(self, partition):
        """Forget what was built for ``partition``."""
        cdef dict ready = self._ready.pop(partition, None)
        if ready is None:
            return
        self.count -= len(ready)
        for _, _, held in ready.values():
            self.held -= held

    def fill(self, partition, items):
        """Build the callbacks of ``items`` ((table key, stored bytes)) of ``partition``."""
        cdef dict ready = self._ready.get(partition)
        cdef Py_ssize_t held
        if ready is None:
            ready = self._ready[partition] = {}
        for key, stored in items:
            try:
                callback = prepare(key, partition, stored)
            except DecodeError:
                continue  # the tick's scan meets it again, and hands it back (take)
            old = ready.get(key)
            if old is None:
                self.count += 1
            else:
                self.held -= old[2]
            held = callback_bytes(callback) + len(stored)
            ready[key] = (callback, stored, held)
            self.held += held

    def take(self, items, list refused not None):
        """The callbacks of the timers ``items`` ((table key, partition, stored bytes)) as a
        tick's scan read them, one at a time: built ahead where the timer is stored exactly as
        it was built from, else built now. A timer whose bytes cannot be built is appended to
        ``refused`` (as its item) instead."""
        cdef dict ready = self._ready
        cdef dict callbacks
        cdef tuple built
        for key, partition, stored in items:
            callbacks = ready.get(partition)
            built = None if callbacks is None else callbacks.pop(key, None)
            if built is not None:
                callback, built_from, held = built
                self.count -= 1
                self.held -= held
                if built_from == stored:
                    yield callback
                    continue
            try:
                callback = prepare(key, partition, stored)
            except DecodeError:
                refused.append((key, partition, stored))
                continue
            yield callback
