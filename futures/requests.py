"""Turn a request record into schedules, cancels, or rejections with their reasons.

Pure functions of (record, config, clock): no Kafka, no table. The engine
decides what a valid request does to the table; this module (and the format
modules in :mod:`futures.formats`) decide whether it is valid and what it means.

:func:`parse_record` is the one public entry point, for the worker and for
anything else that reads request topics (the Spark jobs): it maps one record of
any ingress topic to the requests it holds.
"""

from __future__ import annotations

from dataclasses import replace

from futures.config import WorkerConfig
from futures.formats import PARSERS
from futures.formats.base import (
    MAX_ID_BYTES,
    CancelRequest,
    ParseContext,
    Rejection,
    Request,
    Schedule,
    seed_id,
)
from futures.records import SourceRecord
from ktimers.config import IngressFormat

__all__ = [
    "MAX_ID_BYTES",
    "CancelRequest",
    "Rejection",
    "Request",
    "RequestParser",
    "Schedule",
    "parse_record",
    "parse_request",
    "seed_id",
]


class RequestParser:
    """Parses the records of one batch; ``now_ms`` (epoch ms) is the worker clock for all of them."""

    def __init__(self, config: WorkerConfig, now_ms: int) -> None:
        self._context = ParseContext(config, now_ms)
        self._topics = config.common.topics

    def parse(self, record: SourceRecord) -> list[Request]:
        """See :func:`parse_record`."""
        fmt = self._topics.format_of(record.topic)
        if fmt is None:
            detail = f"{record.topic!r} is not a request topic (TIMERS_TOPIC_REQUEST, TIMERS_INGRESS_TOPICS)"
            return self._named([Rejection(record, "unknown-topic", detail)])
        return self.parse_as(record, fmt)

    def parse_as(self, record: SourceRecord, fmt: IngressFormat) -> list[Request]:
        """Parse ``record`` as ``fmt``, whatever its topic."""
        return self._named(PARSERS[fmt](record, self._context))

    def _named(self, requests: list[Request]) -> list[Request]:
        # Every rejection names a timer id, so its REJECTED event has a key.
        return [
            replace(r, timer_id=self._context.derived_id(r.record))
            if isinstance(r, Rejection) and not r.timer_id
            else r
            for r in requests
        ]


def parse_record(record: SourceRecord, config: WorkerConfig, now_ms: int) -> list[Request]:
    """The requests one record holds, in order: schedules, cancels and rejections.

    ``record.topic`` selects the format: `timer-request` (``config.common.topics.request``)
    is native (a ``Future``, a ``Cancel`` or a ``FutureBatch`` of many timers);
    the topics of ``TIMERS_INGRESS_TOPICS`` carry theirs (etf1, countdown, or
    native). ``now_ms`` is the worker clock, epoch milliseconds: it is the
    ``accepted_ms`` of new timers and the reference of ``TIMERS_MAX_DUE_AHEAD_S``;
    due times never depend on it, except a countdown whose record has no timestamp.

    Deterministic for a given record: ids derived for requests that carry none
    (:func:`seed_id`) come from topic, partition, offset and batch index, so a
    record read twice yields the same timers. Every :class:`Rejection` carries a
    stable ``reason`` code (README, "timer-request-dlq" and "Compatible formats")
    and a timer id. A record of a topic that is no request topic is rejected
    with ``unknown-topic``.
    """
    return RequestParser(config, now_ms).parse(record)


def parse_request(record: SourceRecord, config: WorkerConfig, now_ms: int) -> Request:
    """``record`` parsed as one native request (a ``Future`` or a ``Cancel``), whatever its topic.

    Kept for callers of the single-format API; prefer :func:`parse_record`.
    """
    requests = RequestParser(config, now_ms).parse_as(record, IngressFormat.NATIVE)
    if len(requests) != 1:
        raise ValueError(f"{record.where()} holds {len(requests)} requests: use parse_record")
    return requests[0]
