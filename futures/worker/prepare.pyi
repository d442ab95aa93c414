# The compiled module's types (prepare.pyx).
from futures.worker.callbacks import Callback

def prepare(key: bytes, partition: int, stored: bytes) -> Callback: ...
