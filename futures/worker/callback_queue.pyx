# cython: language_level=3, boundscheck=False, wraparound=False
"""Queueing due timers' callback records into librdkafka: compiled.

Every fired timer goes through :meth:`CallbackQueue.put` once, in second mode a piece of
timers at a time (:meth:`CallbackQueue.put_all`), in precise mode one at its millisecond.
What is left per timer is the check of its callback topic (once per topic and round), its
headers and one call into librdkafka; in the interpreter, the calls around that call were
a sixth of what firing a timer cost the engine (``make bench-engine``).
"""

from confluent_kafka import KafkaException

from ktimers.wire import lay_out_callback_headers

cdef object _lay_out = lay_out_callback_headers
cdef object _UNSEEN = object()
#: librdkafka's unassigned partition: the producer's partitioner chooses.
cdef int _ANY_PARTITION = -1
#: The fields of a ``Callback`` read here (up to its token).
cdef Py_ssize_t _FIELDS = 12


cdef class CallbackQueue:
    """Queues ``Callback`` records into the worker's producer, their reports to a ``Deliveries``."""

    cdef object _queue
    cdef object _produce
    cdef object _problem

    def __init__(self, queue, produce, problem):
        # queue: the producer's own ``produce``, called with positional arguments;
        # produce: ``KafkaWriter.produce``, for a record ``queue`` refused (it waits for room,
        # or reports the refusal under the record's index);
        # problem: what the topic directory knows against a callback topic (None: none).
        self._queue = queue
        self._produce = produce
        self._problem = problem

    cpdef bint put(self, object callback, bytes fired, object deliveries, Py_ssize_t index, dict problems):
        """Queue ``callback`` (``fired``: the dispatch time, epoch ms in decimal, its
        ``kt-fired-ms``); False if its topic has a problem, which lands in ``deliveries.errors``
        under ``index`` as a delivery report would. ``problems``: the topics looked up this
        round, filled as topics come up."""
        if not isinstance(callback, tuple) or len(callback) < _FIELDS:
            raise TypeError(f"a Callback is needed, not {type(callback).__name__}")
        cdef tuple c = <tuple>callback  # its fields by place, as Callback declares them
        topic = c[2]
        problem = problems.get(topic, _UNSEEN)
        if problem is not None:
            if problem is _UNSEEN:
                problem = self._problem(topic)
                problems[topic] = problem
            if problem is not None:
                deliveries.errors[index] = problem
                return False
        headers = _lay_out(c[10], c[8], c[9], c[11], fired)
        try:
            self._queue(topic, c[4], c[3], _ANY_PARTITION, deliveries.on_delivery, None, 0, headers)
        except (BufferError, KafkaException):
            self._produce(topic, c[3], c[4], headers=headers, deliveries=deliveries, index=index)
            return True
        deliveries.pending += 1
        return True

    def put_all(self, callbacks, bytes fired, object deliveries, list sent):
        """Queue each of ``callbacks`` (an iterable, taken as they go out) and append it to
        ``sent``: its index there is the one its failure is reported under."""
        cdef dict problems = {}
        cdef Py_ssize_t index = len(sent)
        for callback in callbacks:
            sent.append(callback)
            self.put(callback, fired, deliveries, index, problems)
            index += 1
