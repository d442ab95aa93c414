"""One service instance for all admin tests: a worker with the admin token set, one oscillator.

Started once for the package (a worker takes seconds to join its group); each test
uses its own callback topic, timer ids and due-time window, so they do not see
each other's timers.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ktimers.broker import free_port
from tests.integration.conftest import Stack, fresh_env
from tests.processes import Service

ADMIN_TOKEN = "admin-test-token-0123456789"
STALL_AFTER_S = 3  # a partition's watermark this far behind shows red
OSCILLATOR = "osc-0"  # the name Stack.start_oscillator gives its first oscillator


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str]


class AdminHttp:
    """A tiny JSON client for the admin API (urllib: no extra dependency)."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def request(self, method: str, path: str, body: bytes | None = None, token: str | None = None) -> Reply:
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(  # noqa: S310 - http to our own server
            self.base + path, data=body, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - our own server
                raw, status, got = response.read(), response.status, dict(response.headers)
        except urllib.error.HTTPError as exc:
            raw, status, got = exc.read(), exc.code, dict(exc.headers)
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = raw.decode(errors="replace")
        return Reply(status, parsed, got)

    def get(self, path: str, token: str | None = ADMIN_TOKEN) -> Reply:
        return self.request("GET", path, token=token)

    def post(self, path: str, payload: object = None, token: str | None = ADMIN_TOKEN) -> Reply:
        body = b"" if payload is None else json.dumps(payload).encode()
        return self.request("POST", path, body, token)


def _spawner(directory: Path, services: list[Service]) -> Any:
    def spawn(name: str, args: list[str], env: dict[str, str], start: bool = True) -> Service:
        service = Service(name, [sys.executable, *args], env, directory / f"{name}-{len(services)}.log")
        services.append(service)
        return service.start() if start else service

    return spawn


@pytest.fixture(scope="package")
def admin_stack(broker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    directory = tmp_path_factory.mktemp("admin")
    env = fresh_env(
        broker_env,
        settings={
            "TIMERS_ADMIN_TOKEN": ADMIN_TOKEN,
            "TIMERS_ADMIN_STALL_AFTER_S": str(STALL_AFTER_S),
            # /metrics alone on a port of its own, as the Helm chart runs the worker.
            "TIMERS_METRICS_PORT": str(free_port()),
        },
    )
    services: list[Service] = []
    stack = Stack(env=env, spawn=_spawner(directory, services), data_dir=directory / "worker-data")
    try:
        stack.start_worker()
        stack.start_oscillator()
        yield stack
    except BaseException:
        for service in services:
            print(f"\n----- {service.name} ({service.log}) -----\n{service.output()[-6000:]}")
        raise
    finally:
        stack.close()
        for service in services:
            service.stop(timeout_s=10)


@pytest.fixture
def http(admin_stack: Stack) -> AdminHttp:
    return AdminHttp(admin_stack.web_port)


def wait_for(condition: Any, timeout_s: float, what: str, interval_s: float = 0.2) -> Any:
    """Poll ``condition()`` until it returns something truthy; fail saying ``what`` never happened."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout_s}s (last: {value!r})")
        time.sleep(interval_s)
