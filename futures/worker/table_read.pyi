# The compiled module's types (table_read.pyx).
from collections.abc import Iterable

def take_due(
    items: Iterable[tuple[bytes, bytes]], max_count: int, max_bytes: int | None
) -> list[tuple[bytes, bytes]]: ...
