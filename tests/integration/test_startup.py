"""The worker refuses a topic layout it cannot serve, and says how to fix it."""

from __future__ import annotations

import json
import urllib.request

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration


def test_worker_refuses_topics_with_different_partition_counts(stack: Stack) -> None:
    topics = stack.common.topics
    admin = AdminClient({"bootstrap.servers": stack.bootstrap})
    mismatched = f"{topics.oscillator}-2"
    admin.create_topics([NewTopic(mismatched, 2, 1)])[mismatched].result()
    stack.env["TIMERS_TOPIC_OSCILLATOR"] = mismatched
    worker = stack.start_worker(wait=False)
    assert worker.process is not None
    assert worker.process.wait(timeout=30) == 2
    message = worker.output()
    assert f"{mismatched!r} has 2 partitions but {topics.request!r} has 4" in message
    assert "timers topics create --partitions 4" in message


def test_worker_reports_ready_once_its_tables_are_recovered(running: Stack) -> None:
    url = f"http://127.0.0.1:{running.web_port}/readyz"
    body = json.loads(urllib.request.urlopen(url, timeout=5).read())  # noqa: S310
    assert body == {"status": "ready", "partitions": [0, 1, 2, 3]}
