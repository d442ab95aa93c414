"""Token guard: the receiver side of cancelling and superseding timers.

A cancel races with the timer it names: the callback may already be on its way.
A receiver that must never act on a cancelled timer guards it with a token::

    token = guard.arm("order-42")                  # a new token replaces any armed one
    timers.schedule("orders", "order-42", b"...", delay=3600, token=token)
    ...
    guard.disarm("order-42")                       # cancel: the callback will be dropped

    # in the consumer of "orders":
    if guard.accept("order-42", msg.headers()):    # True once, for the armed token only
        remind(...)

The worker copies the Future's ``token`` to the callback header ``kt-token``.
``accept`` disarms, so a redelivered callback is dropped: at most one callback
per ``arm``. A receiver that must also survive a crash between ``accept`` and
its own work should make that work idempotent.

Backends differ only in storage (``_load``/``_store``/``_delete``): memory for
tests and single-process receivers, RocksDB for receivers that restart.
"""

from __future__ import annotations

import os
import secrets
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable
from types import TracebackType
from typing import Self

from ktimers.errors import TimersError
from ktimers.wire import H_TOKEN, header_value

__all__ = ["MemoryTokenGuard", "RocksDBTokenGuard", "TokenGuard"]

CallbackHeaders = Iterable[tuple[str, bytes | None]]

# 128 random bits: a stale or forged callback cannot guess the armed token.
_TOKEN_BYTES = 16


class TokenGuard(ABC):
    """Arms one token per name and accepts exactly one callback carrying it.

    Thread-safe: ``accept`` is check-and-disarm under one lock, so two threads
    handling duplicate callbacks cannot both be accepted.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closed = False

    def arm(self, name: str) -> str:
        """Create and store a new random token for ``name``, replacing any armed one.

        Put the returned token in the timer's ``token``; callbacks carrying an
        older token are dropped from now on.
        """
        token = secrets.token_hex(_TOKEN_BYTES)
        with self._lock:
            self._check_open()
            self._store(name, token)
        return token

    def accept(self, name: str, callback_headers: CallbackHeaders | None) -> bool:
        """True exactly once for a callback carrying the token armed for ``name``.

        ``callback_headers`` is what confluent-kafka's ``msg.headers()`` returns
        (None allowed). False when the ``kt-token`` header is missing or holds any
        other token: the timer was cancelled, superseded or already accepted.
        """
        received = header_value(callback_headers, H_TOKEN)
        if not received:
            return False
        with self._lock:
            self._check_open()
            armed = self._load(name)
            if armed is None or armed.encode() != received:
                return False
            self._delete(name)
        return True

    def disarm(self, name: str) -> None:
        """Forget the token of ``name``: its pending callback will not be accepted."""
        with self._lock:
            self._check_open()
            self._delete(name)

    def armed(self, name: str) -> str | None:
        """The token currently armed for ``name``, if any."""
        with self._lock:
            self._check_open()
            return self._load(name)

    def close(self) -> None:
        """Refuse further use; backends also release their storage. Idempotent."""
        with self._lock:
            self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise TimersError(f"this {type(self).__name__} is closed")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # Storage hooks: called with the lock held.

    @abstractmethod
    def _load(self, name: str) -> str | None: ...

    @abstractmethod
    def _store(self, name: str, token: str) -> None: ...

    @abstractmethod
    def _delete(self, name: str) -> None: ...


class MemoryTokenGuard(TokenGuard):
    """Tokens in a dict: lost on restart, so armed timers are then all dropped."""

    def __init__(self) -> None:
        super().__init__()
        self._tokens: dict[str, str] = {}

    def _load(self, name: str) -> str | None:
        return self._tokens.get(name)

    def _store(self, name: str, token: str) -> None:
        self._tokens[name] = token

    def _delete(self, name: str) -> None:
        self._tokens.pop(name, None)


class RocksDBTokenGuard(TokenGuard):
    """Tokens in a RocksDB directory (one per receiver instance), kept across restarts.

    Writes go to RocksDB's write-ahead log, which survives a process crash; pass
    ``sync=True`` to also fsync every write and survive a machine crash, at the
    cost of one disk flush per ``arm``/``accept``/``disarm``.
    """

    def __init__(self, path: str | os.PathLike[str], *, sync: bool = False) -> None:
        super().__init__()
        try:
            # Imported here: the client's base install has no RocksDB (``kafka-timers[guard]``).
            from rocksdict import Options, Rdict, WriteOptions
        except ImportError as exc:
            raise TimersError(
                "RocksDBTokenGuard needs rocksdict: pip install 'kafka-timers[guard]' "
                "(or use MemoryTokenGuard)"
            ) from exc
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self._path = os.fspath(path)
        try:
            self._db = Rdict(self._path, options)
        except Exception as exc:  # rocksdict raises a bare Exception for lock/IO errors
            raise TimersError(
                f"cannot open the token guard database at {self._path!r}: {exc}. "
                "Is another process using it? Each receiver instance needs its own directory."
            ) from exc
        write = WriteOptions()
        write.sync = sync
        self._db.set_write_options(write)

    def close(self) -> None:
        """Flush and close the database (releasing its lock); then refuse further use."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()

    def _load(self, name: str) -> str | None:
        value = self._db.get(name.encode())
        return None if value is None else bytes(value).decode()

    def _store(self, name: str, token: str) -> None:
        self._db.put(name.encode(), token.encode())

    def _delete(self, name: str) -> None:
        self._db.delete(name.encode())
