"""The worker refuses a topic layout it cannot serve, and says how to fix it."""

from __future__ import annotations

import json
import urllib.request

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from futures.worker.config import WorkerConfig
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


def test_worker_says_where_its_admin_page_is(running: Stack) -> None:
    assert running.worker is not None
    page = f"http://127.0.0.1:{running.web_port}/admin/"
    assert f"admin page at {page}" in running.worker.output()
    assert b"<html" in urllib.request.urlopen(page, timeout=5).read().lower()  # noqa: S310


def test_worker_refuses_a_changelog_that_deletes_records(stack: Stack) -> None:
    changelog = WorkerConfig.from_env(stack.env).changelog_topic
    admin = AdminClient({"bootstrap.servers": stack.bootstrap})
    config = {"cleanup.policy": "delete", "retention.ms": "604800000"}
    admin.create_topics([NewTopic(changelog, 4, 1, config=config)])[changelog].result()
    worker = stack.start_worker(wait=False)
    assert worker.process is not None
    assert worker.process.wait(timeout=30) == 2
    assert f"--entity-name {changelog} --add-config cleanup.policy=compact" in worker.output()


def test_a_worker_restarted_on_its_data_dir_reuses_its_tables(running: Stack) -> None:
    assert running.worker is not None
    assert running.worker.stop() == 0
    running.start_worker()
    changelog = WorkerConfig.from_env(running.env).changelog_topic
    output = running.worker.output()
    assert f"changelog {changelog}: not created yet" in output  # the first start
    assert f"changelog {changelog}: cleanup.policy=compact, delete.retention.ms=86400000" in output
    assert "rebuilding the timer table" not in output
