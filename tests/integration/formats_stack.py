"""One service instance with every ingress format, shared by a test module (a worker start costs seconds)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer

from ktimers.config import CommonConfig
from ktimers.topics import create_topics
from tests.integration.conftest import Stack, fresh_env
from tools.stack import Service, spawner

Headers = list[tuple[str, bytes]]


@dataclass
class FormatsStack:
    stack: Stack
    etf1_topic: str
    countdown_topic: str

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: Headers | None = None,
        timestamp_ms: int = 0,
    ) -> None:
        """Produce one record as a foreign producer would (no timer client) and wait for the ack."""
        producer = Producer({"bootstrap.servers": self.stack.bootstrap})
        errors: list[str] = []
        producer.produce(
            topic,
            value,
            key,
            headers=headers or None,
            timestamp=timestamp_ms,
            on_delivery=lambda err, _msg: errors.append(err.str()) if err else None,
        )
        assert producer.flush(10) == 0 and not errors, errors


@contextmanager
def module_stack(env: dict[str, str], directory: Path) -> Iterator[Stack]:
    """A running worker and oscillator for a test module, with ``env`` (its topics created)."""
    services: list[Service] = []
    stack = Stack(env=env, spawn=spawner(directory, services), data_dir=directory / "worker-data")
    try:
        try:
            stack.start_worker()
            stack.start_oscillator()
        except Exception:
            print_logs(stack)
            raise
        yield stack
    finally:
        for service in services:
            service.stop(timeout_s=10)
        stack.close()


def formats_stack(broker_env: dict[str, str], directory: Path) -> Iterator[FormatsStack]:
    """A running worker and oscillator whose request topics are native, etf1 and countdown."""
    env = fresh_env(broker_env)
    suffix = uuid.uuid4().hex[:8]
    etf1, countdown = f"schedules-{suffix}", f"delays-{suffix}"
    env["TIMERS_INGRESS_TOPICS"] = f"{etf1}=etf1,{countdown}=countdown"
    create_topics(CommonConfig.from_env(env))
    with module_stack(env, directory) as stack:
        yield FormatsStack(stack, etf1, countdown)


def print_logs(stack: Stack) -> None:
    for service in [stack.worker, *stack.oscillators]:
        if service is not None:
            print(f"\n----- {service.name} ({service.log}) -----\n{service.output()[-6000:]}")


def dump_logs_on_failure(request: pytest.FixtureRequest, stack: Stack) -> None:
    """Print the services' logs when the test that just ran failed (module-scoped services)."""
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print_logs(stack)
