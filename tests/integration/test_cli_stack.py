"""The ``timers`` command against a running worker: what an operator sees of timers, events and
dead letters without writing a consumer. One worker and one oscillator serve every test here."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from futures.cli import main
from futures.client import TimerClient
from futures.console.output import EXIT_INCOMPLETE, EXIT_NOT_PENDING
from tests.integration.conftest import STACK_LIMITS, Stack, fresh_env
from tests.processes import Service

pytestmark = pytest.mark.integration

READ_TOKEN = "read-token-0123456789abcdef"
ADMIN_TOKEN = "admin-token-0123456789abcdef"


@pytest.fixture(scope="module")
def cli_stack(broker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    logs = tmp_path_factory.mktemp("cli-stack")
    services: list[Service] = []

    def spawn(name: str, args: list[str], env: dict[str, str], start: bool = True) -> Service:
        service = Service(name, [sys.executable, *args], env, logs / f"{name}.log")
        services.append(service)
        return service.start() if start else service

    settings = {**STACK_LIMITS, "TIMERS_ADMIN_READ_TOKEN": READ_TOKEN, "TIMERS_ADMIN_TOKEN": ADMIN_TOKEN}
    stack = Stack(env=fresh_env(broker_env, settings=settings), spawn=spawn, data_dir=logs / "worker-data")
    try:
        stack.start_worker()
        stack.start_oscillator()
        yield stack
    finally:
        stack.close()
        for service in services:
            service.stop(timeout_s=10)


@pytest.fixture
def cli(cli_stack: Stack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """``cli("cancel", "x")`` → (exit status, stdout, stderr), with the stack's environment."""
    for name, value in cli_stack.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TIMERS_ADMIN_URL", f"http://127.0.0.1:{cli_stack.web_port}")

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def json_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_cancel_wait_says_cancelled_then_missed_and_watch_shows_the_events(cli_stack: Stack, cli) -> None:
    reader = cli_stack.callback_topic("cancel-wait")
    with TimerClient(cli_stack.common) as client:
        handle = client.schedule(reader.topic, "k", "v", delay=120)

    code, out, err = cli("cancel", handle.id, "--wait", "--timeout", "20s")
    assert (code, err) == (0, "")
    answer = json.loads(out)
    assert (answer["id"], answer["cancel"], answer["event"]) == (handle.id, "cancelled", "CANCELLED")
    assert answer["due_ms"] == handle.due_ms

    code, out, err = cli("cancel", handle.id, "--wait", "--timeout", "20s")
    assert code == EXIT_NOT_PENDING
    assert json.loads(out)["cancel"] == "missed"
    assert "was not pending: unknown id, or it already fired" in err

    code, out, _ = cli("watch", cli_stack.common.topics.events, "--from-beginning", "--timeout", "2s")
    assert code == 0
    kinds = [line["event"] for line in json_lines(out) if line.get("id") == handle.id]
    assert kinds == ["SCHEDULED", "CANCELLED", "CANCEL_MISSED"]


def test_cancel_wait_without_an_answer_exits_1(cli_stack: Stack, cli, monkeypatch) -> None:
    # A request topic no worker reads: the cancel goes out, and nobody answers.
    monkeypatch.setenv("TIMERS_TOPIC_REQUEST", cli_stack.callback_topic("unread").topic)
    started = time.monotonic()
    code, out, err = cli("cancel", "nobody-reads-this", "--wait", "--timeout", "2s")
    assert code == EXIT_INCOMPLETE
    assert json.loads(out)["cancel"] == "no-answer"
    assert "had no answer within 2s" in err
    assert time.monotonic() - started < 10


def test_watch_decodes_a_dead_letter_with_the_request_it_held(cli_stack: Stack, cli) -> None:
    with TimerClient(cli_stack.common) as client:
        handle = client.schedule("not-allowed-here", "k", "payload", delay=60)
    code, out, err = cli(
        "watch", cli_stack.common.topics.dlq, "--from-beginning", "--count", "1", "--timeout", "20s"
    )
    assert (code, err) == (0, "")
    (line,) = json_lines(out)
    assert line["reason"] == "callback-topic-not-allowed"
    assert line["source"]["topic"] == cli_stack.common.topics.request
    assert line["request"]["id"] == handle.id
    assert line["request"]["payload"] == "payload"

    code, out, _ = cli("watch", cli_stack.common.topics.dlq, "--from-beginning", "--count", "1", "--raw")
    assert code == 0
    assert json_lines(out)[0]["headers"]["kt-reason"] == "callback-topic-not-allowed"


def test_schedule_every_fires_a_series_and_warns_of_a_missing_topic(cli_stack: Stack, cli) -> None:
    reader = cli_stack.callback_topic("every")
    code, out, err = cli(
        *["schedule", "--topic", reader.topic, "--key", "k", "--value", "tick"],
        *["--every", "1s", "--max-count", "2", "--id", "series-1"],
    )
    assert (code, err) == (0, "")  # the topic exists: no warning
    assert json.loads(out)["series"]["interval_ms"] == 1000
    callbacks = reader.read_until(lambda r: len(r) >= 2, timeout_s=20)
    reader.poll(1.5)  # and no third: --max-count 2
    assert [(c.timer_id, c.value) for c in callbacks] == [("series-1", b"tick")] * 2

    missing = "cb-missing-topic-for-the-warning"
    code, _, err = cli("schedule", "--topic", missing, "--key", "k", "--value", "v", "--delay", "1h")
    assert code == 0
    assert err.startswith(f"timers schedule: warning: topic '{missing}' does not exist on ")
    assert f"timers topics create --callback {missing}" in err
    assert err.count("\n") == 1


def test_list_and_show_pending_timers_through_the_admin_api(cli_stack: Stack, cli, monkeypatch) -> None:
    start = time.time() + 10 * 86400
    with TimerClient(cli_stack.common) as client:
        handles = [client.schedule("cb-listed", f"k{i}", f"payload {i}", at=start + i) for i in range(3)]
    window = ["--from", str(int(start)), "--to", str(int(start) + 10)]

    def listing(*extra: str) -> dict:
        code, out, err = cli("list", *window, "--json", *extra)
        assert (code, err) == (0, "")
        return json.loads(out)

    deadline = time.monotonic() + 15
    while len(listing()["timers"]) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)  # the worker takes them in
    first = listing("--limit", "2")
    assert [t["id"] for t in first["timers"]] == [h.id for h in handles[:2]]
    assert first["workers"] == [f"http://127.0.0.1:{cli_stack.web_port}"]
    assert first["missing_partitions"] == []
    rest = listing("--limit", "2", "--after", first["next"])
    assert ([t["id"] for t in rest["timers"]], rest["next"]) == ([handles[2].id], None)

    code, out, _ = cli("list", *window)
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["ID", "PARTITION", "DUE", "CALLBACK_TOPIC", "CALLBACK_KEY", "PAYLOAD_BYTES"]
    assert [row.split()[0] for row in rows] == [h.id for h in handles]
    assert rows[0].split()[3:] == ["cb-listed", "k0", "9"]

    code, out, _ = cli("show", handles[1].id, "--json", "--payload")
    assert code == 0
    shown = json.loads(out)
    assert (shown["id"], shown["callback_key"], shown["payload"]) == (handles[1].id, "k1", "payload 1")
    code, out, _ = cli("show", handles[1].id)
    assert code == 0
    assert any(line.split() == ["callback_topic", "cb-listed"] for line in out.splitlines())

    code, out, err = cli("show", "no-such-timer")
    assert (code, out) == (EXIT_NOT_PENDING, "")
    assert "'no-such-timer' is not pending on any worker" in err

    monkeypatch.delenv("TIMERS_ADMIN_READ_TOKEN")
    monkeypatch.setenv("TIMERS_ADMIN_TOKEN", "not-the-token-0123456789")
    code, out, err = cli("list")
    assert (code, out) == (2, "")
    assert "refused: the token sent is not one of its tokens: set TIMERS_ADMIN_READ_TOKEN" in err
    code, _, err = cli("show", "x", "--admin", "http://127.0.0.1:1")
    assert code == 2
    assert "cannot reach the admin API at http://127.0.0.1:1" in err
    assert err.count("\n") == 1


def test_status_says_who_holds_what_with_clocks_and_oscillators(cli_stack: Stack, cli) -> None:
    cli_stack.wait_for_tick(timeout_s=20)
    with TimerClient(cli_stack.common) as client:
        client.schedule("cb-status", "k", "v", delay=3600, id="status-1")
    worker = f"http://127.0.0.1:{cli_stack.web_port}"
    deadline = time.monotonic() + 20
    while True:  # until the worker has committed what it took in (it commits every few seconds)
        code, out, err = cli("status", "--json")
        assert (code, err) == (0, "")
        status = json.loads(out)
        lags = {p["request_lag"] for p in status["partitions"]}
        if (lags - {None} and lags <= {0, None}) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    lags = [p["request_lag"] for p in status["partitions"] if p["request_lag"] is not None]
    assert lags and set(lags) == {0}  # committed, and nothing left to take in
    assert [w["url"] for w in status["workers"]] == [worker]
    assert status["workers"][0]["partitions"] == [0, 1, 2, 3]
    rows = status["partitions"]
    assert [(p["partition"], p["worker"]) for p in rows] == [(i, worker) for i in range(4)]
    assert all(abs(p["watermark_s"] - time.time()) < 30 for p in rows)
    assert all(p["request_lag"] is None or p["request_lag"] >= 0 for p in rows)
    assert [o["source"] for o in status["oscillators"]] == ["osc-0"]

    code, out, _ = cli("status")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["WORKER", "READY", "PARTITIONS"]
    assert lines[1].split()[:3] == [worker, "yes", "0,1,2,3"]
    partition_header = lines.index(next(line for line in lines if line.startswith("PARTITION ")))
    assert lines[partition_header].split() == [
        "PARTITION", "WORKER", "PENDING", "CLOCK", "CLOCK_LAG_S", "LAST_TICK_AGE_S", "STALLED", "REQUEST_LAG"
    ]  # fmt: skip
    assert any(line.split()[:1] == ["osc-0"] for line in lines)


def test_a_dead_letter_is_resent_as_it_was_sent_once_its_topic_exists(cli_stack: Stack, cli) -> None:
    topic = f"cb-created-late-{time.monotonic_ns()}"
    with TimerClient(cli_stack.common) as client:
        handle = client.schedule(topic, "k", "late but there", delay=0.5)
    dlq = cli_stack.reader(cli_stack.common.topics.dlq)

    def undeliverable(records) -> list:
        return [r for r in records if r.key == handle.id.encode()]

    (letter,) = undeliverable(dlq.read_until(lambda r: bool(undeliverable(r)), timeout_s=20))
    where = ["--partition", str(letter.partition), "--offset", str(letter.offset)]

    code, out, err = cli("deadletter", "resend", *where)
    assert (code, out) == (2, "")
    assert f"callback topic '{topic}' still does not exist: create it (timers topics create --callback" in err

    admin = AdminClient({"bootstrap.servers": cli_stack.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result()
    code, out, err = cli("deadletter", "resend", *where, "--dry-run")
    assert (code, err) == (0, "")
    assert out.startswith(f"would resend {cli_stack.common.topics.dlq}[{letter.partition}]@{letter.offset}")
    assert "(callback-undeliverable) to " + cli_stack.common.topics.request in out

    code, out, err = cli("deadletter", "resend", *where, "--json")
    assert (code, err) == (0, "")
    sent = json.loads(out)
    assert (sent["sent"], sent["dead_letter"]["reason"]) == (True, "callback-undeliverable")
    assert sent["to"]["topic"] == cli_stack.common.topics.request
    request = cli_stack.reader(cli_stack.common.topics.request)
    at = (sent["to"]["partition"], sent["to"]["offset"])
    (resent,) = [
        r for r in request.read_until(lambda rs: any((r.partition, r.offset) == at for r in rs), 15)
        if (r.partition, r.offset) == at
    ]  # fmt: skip
    assert (resent.key, resent.value) == (letter.key, letter.value)
    assert [k for k, _ in resent.headers if k.startswith("kt-")] == []  # the worker's headers are gone


def test_resend_of_what_is_no_dead_letter_says_so(cli_stack: Stack, cli) -> None:
    code, out, err = cli(
        "deadletter", "resend", "--partition", "0", "--offset", "999999", "--delivery-timeout", "3s"
    )
    assert (code, out) == (2, "")
    assert "no record at that offset" in err and "check --offset" in err
    code, _, err = cli("deadletter", "resend", "--partition", "9", "--offset", "0")
    assert code == 2
    assert "no such topic partition (it has partitions 0 to 3)" in err
