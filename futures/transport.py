"""Faust's Kafka transport with a short fetch wait, for the embedded broker only.

Faust hardcodes ``fetch_max_wait_ms=1500`` for its consumer. Kafka answers a
waiting fetch as soon as data arrives, so that costs nothing there; Tansu waits
out the full time, which delayed ticks — and so timers — by up to 1.5 s. The
embedded broker profile consumes through this transport (scheme ``tansu://``,
registered as a ``faust.transports`` entry point) instead.
"""

from __future__ import annotations

from typing import Any

from faust.transport.drivers import aiokafka as faust_aiokafka

#: How long the broker may hold a fetch with no new data (ms).
EMBEDDED_FETCH_MAX_WAIT_MS = 100


class ShortFetchConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # aiokafka hands this to its Fetcher in start(), which has not run yet.
        consumer._fetch_max_wait_ms = EMBEDDED_FETCH_MAX_WAIT_MS
        return consumer


class ShortFetchConsumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> ShortFetchConsumerThread:
        return ShortFetchConsumerThread(self, loop=self.loop, beacon=self.beacon)


class EmbeddedBrokerTransport(faust_aiokafka.Transport):
    Consumer = ShortFetchConsumer
