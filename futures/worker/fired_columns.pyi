# The compiled module's types (fired_columns.pyx).
from futures.worker.callbacks import Callback

def fired_columns(
    callbacks: list[Callback], fired: list[int]
) -> tuple[dict[int, tuple[list[str], list[int], list[int]]], list[int]]: ...
def keys_by_partition(callbacks: list[Callback]) -> tuple[dict[int, list[bytes]], list[Callback]]: ...
