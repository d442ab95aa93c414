# The compiled module's types (callback_queue.pyx).
from collections.abc import Callable, Iterable

from confluent_kafka import KafkaError

from futures.worker.callbacks import Callback
from futures.worker.kafka import Deliveries

class CallbackQueue:
    def __init__(
        self,
        queue: Callable[..., None],
        produce: Callable[..., None],
        problem: Callable[[str], KafkaError | None],
    ) -> None: ...
    def put(
        self,
        callback: Callback,
        fired: bytes,
        deliveries: Deliveries,
        index: int,
        problems: dict[str, KafkaError | None],
    ) -> bool: ...
    def put_all(
        self, callbacks: Iterable[Callback], fired: bytes, deliveries: Deliveries, sent: list[Callback]
    ) -> None: ...
