"""What every ``timers`` command shares in what it prints and returns."""

from __future__ import annotations

import json
import logging
from typing import Any

from futures.console.decode import iso_ms

EXIT_INCOMPLETE = 1  # watch --count not reached, or no answer to cancel --wait, before --timeout
EXIT_NOT_PENDING = 3  # the timer is not pending: a cancel --wait missed it, show found it nowhere

# librdkafka logs every failed connection attempt; routed here and silenced
# unless --verbose, so an unreachable broker yields one clear line, not a stream.
kafka_log = logging.getLogger("timers.kafka")


def print_json(obj: dict[str, Any]) -> None:
    """One JSON object on one line, flushed: a reader of a stream sees each as it comes."""
    print(json.dumps(obj, ensure_ascii=False), flush=True)


def shown_time(epoch_ms: object) -> object:
    """Epoch milliseconds as a UTC time for a table; anything else as it is."""
    return iso_ms(epoch_ms) if type(epoch_ms) is int else epoch_ms
