"""``timers-worker``'s process: what it sets up before it starts the worker, and what it refuses
to start with, in one line that says what to fix."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from futures.worker.malloc import MALLOC_ARENAS, limit_malloc_arenas
from ktimers.broker import free_port

REPO = Path(__file__).resolve().parents[2]

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


@pytest.fixture
def offline_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A worker environment whose Kafka is a port nobody listens on, with a web port of its own."""
    with socket.socket() as held:  # bound, never listening: connections are refused
        held.bind(("127.0.0.1", 0))
        yield {
            **os.environ,
            "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{held.getsockname()[1]}",
            "TIMERS_DATA_DIR": str(tmp_path / "data"),
            "TIMERS_WEB_PORT": str(free_port()),
        }


def run_worker(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "futures.worker.main"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )


def one_line_and_status_2(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("timers-worker: error: ")
    return line


@pytest.mark.parametrize(
    ("setting", "value", "says"),
    [
        ("TIMERS_LOG_LEVEL", "verbose", "TIMERS_LOG_LEVEL='verbose': use one of debug, info, warning, error"),
        ("TIMERS_WEB_PORT", "0", "TIMERS_WEB_PORT=0: use a port number from 1 to 65535"),
        ("KAFKA_SECURITY_PROTOCOL", "SSL", "KAFKA_SSL_CA_LOCATION="),
    ],
)
def test_a_bad_setting_is_one_line_naming_it_and_status_2(
    offline_env: dict[str, str], setting: str, value: str, says: str
) -> None:
    env = {**offline_env, setting: value}
    if setting == "KAFKA_SECURITY_PROTOCOL":
        env["KAFKA_SSL_CA_LOCATION"] = "/nonexistent/ca.crt"

    assert says in one_line_and_status_2(run_worker(env))


def test_a_taken_web_port_is_one_line_saying_so(offline_env: dict[str, str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_line_and_status_2(run_worker({**offline_env, "TIMERS_WEB_PORT": str(port)}))

    assert f"cannot serve on 127.0.0.1:{port}" in line
    assert "set TIMERS_WEB_PORT to a free port" in line


def test_a_data_dir_that_cannot_be_created_is_one_line_naming_it(
    offline_env: dict[str, str], tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")

    line = one_line_and_status_2(run_worker({**offline_env, "TIMERS_DATA_DIR": str(blocker / "data")}))

    assert f"TIMERS_DATA_DIR='{blocker / 'data'}'" in line
    assert "Point it at a directory this user can write" in line
