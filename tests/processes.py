"""Fixtures that run the services as real processes, so tests can SIGKILL them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest


@dataclass
class Service:
    """One service process; its output goes to ``log`` (shown when a test fails)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    process: subprocess.Popen[bytes] | None = None
    starts: int = field(default=0)

    def start(self) -> Service:
        self.starts += 1
        out = open(self.log, "ab")  # noqa: SIM115 - handed to the child
        out.write(f"\n===== start #{self.starts} =====\n".encode())
        out.flush()
        self.process = subprocess.Popen(
            self.argv, env={**os.environ, **self.env}, stdout=out, stderr=subprocess.STDOUT
        )
        out.close()
        return self

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM, as Kubernetes does; SIGKILL if it does not exit in time."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL: no flush, no commit, no goodbye."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def current_output(self) -> str:
        """Output of the latest start only."""
        return self.output().rpartition(f"===== start #{self.starts} =====")[2]

    def wait_for_output(self, needle: str, timeout_s: float) -> None:
        """Wait until the latest start of the process printed ``needle``."""
        deadline = time.monotonic() + timeout_s
        while needle not in self.current_output():
            if not self.running:
                raise AssertionError(f"{self.name} exited early:\n{self.output()[-4000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.name}: no {needle!r} after {timeout_s}s:\n{self.output()[-4000:]}"
                )
            time.sleep(0.1)


SpawnFn = Callable[..., Service]


@pytest.fixture
def spawn(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[SpawnFn]:
    """``spawn("oscillator", ["-m", "oscillator.main"], env)`` → a started :class:`Service`.

    Every process is stopped at teardown; logs of all of them are printed when the test failed.
    """
    services: list[Service] = []

    def _spawn(name: str, args: list[str], env: dict[str, str], start: bool = True) -> Service:
        service = Service(name, [sys.executable, *args], env, tmp_path / f"{name}-{len(services)}.log")
        services.append(service)
        return service.start() if start else service

    yield _spawn
    for service in services:
        service.stop(timeout_s=10)
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for service in services:
            print(f"\n----- {service.name} ({service.log}) -----\n{service.output()[-6000:]}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
