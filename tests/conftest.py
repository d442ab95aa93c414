"""Shared fixtures.

Integration tests run against a real broker: the embedded Tansu one, started once
per session on 127.0.0.1, or the cluster named by ``KAFKA_BOOTSTRAP_SERVERS``.
Every test gets fresh, uniquely named topics, so tests never see each other's data.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ktimers.broker import EmbeddedBroker, start_broker
from ktimers.config import CommonConfig
from ktimers.topics import create_topics

pytest_plugins = ["tests.processes"]


@pytest.fixture(scope="session")
def broker_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Environment pointing at the test broker (``KAFKA_*`` and the broker profile)."""
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if external:
        yield {
            "KAFKA_BOOTSTRAP_SERVERS": external,
            "TIMERS_BROKER_PROFILE": os.environ.get("TIMERS_BROKER_PROFILE", "cluster"),
        }
        return
    log = tmp_path_factory.mktemp("broker") / "tansu.log"
    broker: EmbeddedBroker = start_broker(log_path=str(log))
    try:
        yield broker.env()
    finally:
        broker.stop()


@pytest.fixture
def unique() -> Callable[[str], str]:
    """``unique("orders")`` → a name no other test uses."""
    suffix = uuid.uuid4().hex[:8]
    return lambda base: f"{base}-{suffix}"


@pytest.fixture
def timers_env(broker_env: dict[str, str], unique: Callable[[str], str]) -> dict[str, str]:
    """Environment for one test's service instance: its own topics and app id, created."""
    env = {
        **broker_env,
        "TIMERS_TOPIC_OSCILLATOR": unique("oscillator"),
        "TIMERS_TOPIC_REQUEST": unique("timer-request"),
        "TIMERS_TOPIC_EVENTS": unique("timer-events"),
        "TIMERS_TOPIC_DLQ": unique("timer-request-dlq"),
        "TIMERS_PARTITIONS": "4",
        "TIMERS_APP_ID": unique("timers"),
    }
    create_topics(CommonConfig.from_env(env))
    return env


@pytest.fixture
def common(timers_env: dict[str, str]) -> CommonConfig:
    return CommonConfig.from_env(timers_env)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    return path
