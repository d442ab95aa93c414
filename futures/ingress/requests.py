"""Turn a request record into schedules, cancels, or rejections with their reasons.

Pure functions of (record, limits, clock): no Kafka, no table. The engine
decides what a valid request does to the table; this module (and the format
modules in :mod:`futures.ingress.formats`) decide whether it is valid and what it means.

:func:`parse_record` is the one public entry point, for the worker and for
anything else that reads request topics (the Spark jobs): it maps one record of
any ingress topic to the requests it holds.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from futures.ingress.base import (
    MAX_DUE_MS,
    MAX_ID_BYTES,
    CancelRequest,
    ParseContext,
    Rejection,
    Request,
    Schedule,
    seed_id,
    shown,
)
from futures.ingress.formats import PARSERS
from futures.ingress.limits import ParseLimits
from futures.ingress.records import SourceRecord
from ktimers.config import IngressFormat
from ktimers.deadletter import short
from ktimers.logs import ThrottledLog

__all__ = [
    "MAX_DUE_MS",
    "MAX_ID_BYTES",
    "CancelRequest",
    "Rejection",
    "Request",
    "RequestParser",
    "Schedule",
    "parse_record",
    "seed_id",
]

log = logging.getLogger(__name__)
# A bug of ours, with its traceback; but a flood of records that trigger it must not flood the log.
_internal_errors_log = ThrottledLog(log)

#: Longest ``internal-error`` detail (characters): an exception's text may quote the input.
INTERNAL_ERROR_DETAIL_CHARS = 200


class RequestParser:
    """Parses the records of one batch; ``now_ms`` (epoch ms) is the worker clock for all of them."""

    def __init__(self, limits: ParseLimits, now_ms: int) -> None:
        self._context = ParseContext(limits, now_ms)
        self._topics = limits.topics

    @property
    def context(self) -> ParseContext:
        """What the formats parse with (for their fast paths: :func:`futures.ingress.native.fast_parse`)."""
        return self._context

    def parse(self, record: SourceRecord) -> list[Request]:
        """See :func:`parse_record`."""
        fmt = self._topics.format_of(record.topic)
        if fmt is None:
            where = "TIMERS_TOPIC_REQUEST, TIMERS_INGRESS_TOPICS"
            detail = f"{shown(record.topic)} is not a request topic ({where})"
            return self._named([Rejection(record, "unknown-topic", detail)])
        return self.parse_as(record, fmt)

    def parse_as(self, record: SourceRecord, fmt: IngressFormat) -> list[Request]:
        """Parse ``record`` as ``fmt``, whatever its topic. Never raises: see :func:`parse_record`."""
        try:
            return self._named(PARSERS[fmt](record, self._context))
        except Exception as exc:
            # A record must never stop the worker: whatever a parser did not
            # foresee is this record's fault as far as the stream goes, so it is
            # dead-lettered like any other bad record (and logged: it is our bug).
            _internal_errors_log.error(
                "%s: parsing failed; the record is dead-lettered as internal-error",
                record.where(),
                exc_info=True,
            )
            # The text may quote input: bounded, and UTF-8 whatever it quotes (it goes in a header).
            text = f"{type(exc).__name__}: {exc}"[: INTERNAL_ERROR_DETAIL_CHARS + 1]
            detail = short(text.encode(errors="backslashreplace").decode(), INTERNAL_ERROR_DETAIL_CHARS)
            return [Rejection(record, "internal-error", detail, self._context.derived_id(record))]

    def _named(self, requests: list[Request]) -> list[Request]:
        # Every rejection names a timer id, so its REJECTED event has a key: its
        # own, or the derived one when it has none or one too long to be a key.
        return [
            replace(r, timer_id=self._context.derived_id(r.record))
            if isinstance(r, Rejection) and (not r.timer_id or len(r.timer_id.encode()) > MAX_ID_BYTES)
            else r
            for r in requests
        ]


def parse_record(record: SourceRecord, limits: ParseLimits, now_ms: int) -> list[Request]:
    """The requests one record holds, in order: schedules, cancels and rejections.

    ``record.topic`` selects the format: `timer-request` (``limits.topics.request``)
    is native (a ``Future``, a ``Cancel`` or a ``FutureBatch`` of many timers);
    the topics of ``TIMERS_INGRESS_TOPICS`` carry theirs (etf1, countdown, or
    native). ``now_ms`` is the worker clock, epoch milliseconds: it is the
    ``accepted_ms`` of new timers and the reference of ``TIMERS_MAX_DUE_AHEAD_S``;
    due times never depend on it, except a countdown whose record has no timestamp.

    Deterministic for a given record: ids derived for requests that carry none
    (:func:`seed_id`) come from topic, partition, offset and batch index, so a
    record read twice yields the same timers. Every :class:`Rejection` carries a
    stable ``reason`` code (README, "timer-request-dlq" and "Compatible formats"),
    a detail of bounded length and a timer id of at most :data:`MAX_ID_BYTES`.
    A record of a topic that is no request topic is rejected with
    ``unknown-topic``. Total: whatever the record holds, this returns; an
    exception of a format parser becomes an ``internal-error`` rejection.
    """
    return RequestParser(limits, now_ms).parse(record)
