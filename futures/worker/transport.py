"""Faust's Kafka transport, with two changes the timer worker needs.

1. **Resume from the table, not from Faust's committed offsets.** Faust acks
   (and so commits) records it skips without processing: those fetched while
   flow control is suspended, as it is during a rebalance and at shutdown. For
   most apps that is a re-delivery on the next owner; for us a committed but
   unapplied timer request is a lost timer. The timer table already records,
   in the changelog, the last request offset it applied (``m:progress``), so
   after recovery the consumer seeks every ingress partition to just past it.
   Committed offsets remain a hint for monitoring and for partitions that have
   no progress yet.
2. **A short fetch wait on the embedded broker.** Faust hardcodes
   ``fetch_max_wait_ms=1500``. Kafka answers a waiting fetch as soon as data
   arrives, so that costs nothing there; Tansu waits out the full time, which
   delayed ticks — and so timers — by up to 1.5 s.

Registered as ``faust.transports`` entry points: ``timers://`` (any Kafka) and
``tansu://`` (the embedded broker profile).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from futures.worker.store import TimerStore

log = logging.getLogger(__name__)

#: How long the embedded broker may hold a fetch with no new data (ms).
EMBEDDED_FETCH_MAX_WAIT_MS = 100


class TimerConsumer(faust_aiokafka.Consumer):
    async def seek_to_committed(self) -> Mapping[TP, int]:
        positions = dict(await super().seek_to_committed())
        assignment = self.assignment()
        for table in self.app.tables.values():
            store = table.data
            if not isinstance(store, TimerStore):
                continue
            for tp, offset in store.resume_positions(assignment).items():
                committed = positions.get(tp)
                if committed != offset:
                    log.info("%s: resuming at %d, after the last applied request (committed: %s)",
                             tp, offset, committed)  # fmt: skip
                    await self.seek(tp, offset)
                positions[tp] = offset
        return positions


class TimerTransport(faust_aiokafka.Transport):
    Consumer = TimerConsumer


class ShortFetchConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # aiokafka hands this to its Fetcher in start(), which has not run yet.
        consumer._fetch_max_wait_ms = EMBEDDED_FETCH_MAX_WAIT_MS
        return consumer


class ShortFetchConsumer(TimerConsumer):
    def _new_consumer_thread(self) -> ShortFetchConsumerThread:
        return ShortFetchConsumerThread(self, loop=self.loop, beacon=self.beacon)


class EmbeddedBrokerTransport(TimerTransport):
    Consumer = ShortFetchConsumer
