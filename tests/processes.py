"""Fixtures that run the services as real processes, so tests can SIGKILL them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.stack import Service, SpawnFn, spawner

__all__ = ["Service", "SpawnFn", "spawn"]


@pytest.fixture
def spawn(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[SpawnFn]:
    """``spawn("oscillator", ["-m", "oscillator.main"], env)`` → a started :class:`Service`.

    Every process is stopped at teardown; logs of all of them are printed when the test failed.
    """
    services: list[Service] = []
    yield spawner(tmp_path, services)
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
