"""``timers-worker``'s process: what it sets up before it starts the worker."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest

from futures.worker.malloc import MALLOC_ARENAS, limit_malloc_arenas

# Threads that allocate at once, then the arenas glibc's malloc made for them (malloc_info's
# <heap> elements; the main arena is one of them).
_ARENAS = textwrap.dedent(
    """
    import ctypes, re, sys, tempfile, threading
    from futures.worker.malloc import limit_malloc_arenas
    if sys.argv[1] == "limit":
        limit_malloc_arenas()
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    libc.fclose.argtypes = [ctypes.c_void_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    started = threading.Barrier(8)
    def allocate():
        started.wait()
        kept = [bytearray(4096) for _ in range(2000)]
        started.wait()
    threads = [threading.Thread(target=allocate) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with tempfile.NamedTemporaryFile() as out:
        handle = libc.fopen(out.name.encode(), b"w")
        libc.malloc_info(0, handle)
        libc.fclose(handle)
        print(len(re.findall(rb"<heap nr=", out.read())))
    """
)


def _arenas(mode: str, **env: str) -> int:
    environ = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | env
    done = subprocess.run(
        [sys.executable, "-c", _ARENAS, mode], capture_output=True, text=True, env=environ, check=True
    )
    return int(done.stdout)


glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc arenas are glibc's")


@glibc
def test_the_workers_threads_share_a_few_malloc_arenas() -> None:
    assert _arenas("as-is") > MALLOC_ARENAS  # a thread's own arena each, without the limit
    assert _arenas("limit") <= MALLOC_ARENAS


@glibc
def test_malloc_arena_max_in_the_environment_decides() -> None:
    assert _arenas("limit", MALLOC_ARENA_MAX="4") > MALLOC_ARENAS


def test_the_limit_is_left_to_the_environment_when_it_sets_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    assert limit_malloc_arenas() is False
