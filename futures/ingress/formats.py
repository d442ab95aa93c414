"""The parser of each ingress format: one module per format, each a pure ``parse(record, context)``.

Which topic carries which format is configuration (``TIMERS_INGRESS_TOPICS``,
see :class:`ktimers.config.TopicsConfig`); :func:`futures.ingress.requests.parse_record`
dispatches on the record's topic.
"""

from __future__ import annotations

from collections.abc import Callable

from futures.ingress import countdown, etf1, native
from futures.ingress.base import ParseContext, Request
from futures.ingress.records import SourceRecord
from ktimers.config import IngressFormat

Parser = Callable[[SourceRecord, ParseContext], list[Request]]

PARSERS: dict[IngressFormat, Parser] = {
    IngressFormat.NATIVE: native.parse,
    IngressFormat.ETF1: etf1.parse,
    IngressFormat.COUNTDOWN: countdown.parse,
}
