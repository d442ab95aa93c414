# The compiled module's types (built_ahead.pyx).
from collections.abc import Iterable, Iterator

from futures.worker.callbacks import Callback

class BuiltAhead:
    count: int
    held: int
    def partitions(self) -> list[int]: ...
    def drop(self, partition: int) -> None: ...
    def fill(self, partition: int, items: Iterable[tuple[bytes, bytes]]) -> None: ...
    def take(
        self, items: Iterable[tuple[bytes, int, bytes]], refused: list[tuple[bytes, int, bytes]]
    ) -> Iterator[Callback]: ...
