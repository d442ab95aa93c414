"""The ``timers`` command and the duration/time parsing behind it (no broker needed)."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_NOT_AVAILABLE
from hypothesis import given
from hypothesis import strategies as st

from futures.cli import main
from futures.client import TimerClient
from futures.console import connect, schedule
from futures.console.watch import record_json
from futures.durations import parse_duration, parse_instant
from ktimers.config import CommonConfig
from ktimers.wire import Future
from tests.client.test_client import FakeProducer
from tests.ingress.fuzzing import FUZZ

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1.5", 1.5),
        ("0", 0.0),
        ("5s", 5.0),
        ("250ms", 0.25),
        ("1m30s", 90.0),
        ("2h", 7200.0),
        ("3d", 259200.0),
        ("1h30m", 5400.0),
        ("1d2h3m4s5ms", 93784.005),
        (" 2H ", 7200.0),
        ("1.5m", 90.0),
    ],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty duration"),
        ("5x", "invalid duration"),
        ("-5s", "invalid duration"),
        ("-1", "invalid duration"),
        ("s", "invalid duration"),
        ("1m 30s", "invalid duration"),
        ("30s1m", "largest first"),
        ("1m1m", "largest first"),
    ],
)
def test_parse_duration_rejects(text, message):
    with pytest.raises(ValueError, match=message):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "epoch_s"),
    [
        ("2026-11-21T17:00:00Z", datetime(2026, 11, 21, 17, tzinfo=UTC).timestamp()),
        ("2026-11-21T18:00:00+01:00", datetime(2026, 11, 21, 17, tzinfo=UTC).timestamp()),
        ("2026-11-21T17:00:00.250Z", datetime(2026, 11, 21, 17, tzinfo=UTC).timestamp() + 0.25),
        ("1795280400", 1795280400.0),
        ("1795280400.5", 1795280400.5),
    ],
)
def test_parse_instant(text, epoch_s):
    assert parse_instant(text) == pytest.approx(epoch_s)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2026-11-21T17:00:00", "no zone"),
        ("tomorrow", "invalid time"),
        ("1795280400000", "looks like epoch milliseconds"),
        ("", "empty time"),
    ],
)
def test_parse_instant_rejects(text, message):
    with pytest.raises(ValueError, match=message):
        parse_instant(text)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


BASE = ["schedule", "--topic", "orders", "--key", "k", "--value", "v"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], "timers: error: the following arguments are required: COMMAND (see: timers --help)"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([*BASE, "--delay", "5x"], "timers schedule: error: argument --delay: invalid duration '5x'"),
        ([*BASE], "give --delay or --at (or --cron or --every for a recurring timer)"),
        ([*BASE, "--every", "0.5s"], "the shortest interval is 1000 ms"),
        ([*BASE, "--every", "1m", "--cron", "@daily"], "argument --cron: not allowed with argument --every"),
        ([*BASE, "--cron", "* * *"], "cron expression '* * *' has 3 fields; expected 5"),
        ([*BASE, "--cron", "@daily", "--tz", "Mars/Olympus"], "unknown time zone 'Mars/Olympus'"),
        ([*BASE, "--delay", "1", "--tz", "UTC"], "--tz is the time zone of --cron: give --cron too"),
        (
            [*BASE, "--delay", "1", "--max-count", "2"],
            "--max-count ends a series: give --cron or --every too",
        ),
        ([*BASE, "--every", "1m", "--until", "2001-01-01T00:00:00Z"], "the series would be empty"),
        ([*BASE, "--delay", "5s", "--at", "1795280400"], "not allowed with argument"),
        ([*BASE, "--at", "2026-11-21T17:00:00"], "append Z for UTC"),
        ([*BASE, "--delay", "1", "--header", "novalue"], "expected NAME=VALUE"),
        (["schedule", "--topic", "t", "--key", "k", "--delay", "1"], "--value --value-file is required"),
        (["schedule", "--key", "k", "--value", "v", "--delay", "1"], "required: --topic"),
        (["watch", "t", "--count", "0"], "at least 1"),
        (["topics"], "timers topics: error: the following arguments are required: ACTION"),
        (["topics", "create", "--partitions", "x"], "expected a whole number"),
    ],
)
def test_usage_errors_exit_2_with_one_line(capsys, argv, expected):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert expected in err
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_help_exits_0(capsys):
    code, out, _ = run(capsys, "schedule", "--help")
    assert code == 0
    assert "--delay" in out and "1m30s" in out


def test_bad_kafka_config_exits_2(capsys, monkeypatch):
    monkeypatch.setenv("KAFKA_SECURITY_PROTOCOL", "carrier-pigeon")
    code, _, err = run(capsys, *BASE, "--delay", "1")
    assert code == 2
    assert err.startswith("timers: error: KAFKA_SECURITY_PROTOCOL='CARRIER-PIGEON': use PLAINTEXT")


def test_missing_value_file_exits_2(capsys, tmp_path):
    missing = tmp_path / "nope.bin"
    code, _, err = run(
        capsys, "schedule", "--topic", "t", "--key", "k", "--value-file", str(missing), "--delay", "1"
    )
    assert code == 2
    assert f"cannot read --value-file '{missing}'" in err


@pytest.fixture
def fake_producer(monkeypatch) -> FakeProducer:
    """Route the CLI's client to a fake producer."""
    producer = FakeProducer()

    def client(common: CommonConfig, delivery_timeout_s: float) -> TimerClient:
        return TimerClient(CommonConfig(), producer=producer)

    monkeypatch.setattr(connect, "client", client)
    monkeypatch.setattr(schedule, "warn_if_missing", lambda common, topic: None)
    return producer


def test_schedule_prints_the_handle_and_sends_the_timer(capsys, fake_producer, tmp_path):
    payload = tmp_path / "payload.bin"
    payload.write_bytes(b"\x00\x01binary")
    before = time.time()
    code, out, err = run(
        capsys,
        *["schedule", "--topic", "orders", "--key", "order-42", "--value-file", str(payload)],
        *["--delay", "1m30s", "--id", "r-1", "--token", "tk", "--header", "a=1", "--header", "b=x=y"],
    )
    after = time.time()
    assert (code, err) == (0, "")
    printed = json.loads(out)
    assert printed["id"] == "r-1" and printed["key"] == "order-42" and printed["topic"] == "orders"
    assert round((before + 90) * 1000) <= printed["due_ms"] <= round((after + 90) * 1000)
    due = datetime.fromisoformat(printed["due"])
    assert abs(due.timestamp() * 1000 - printed["due_ms"]) < 1

    (record,) = fake_producer.records
    future = Future()
    future.ParseFromString(record.value)
    assert record.key == b"r-1"
    assert future.callBack == b"\x00\x01binary"
    assert future.due_ms == printed["due_ms"]
    assert (future.token, printed["token"]) == ("tk", "tk")
    assert [(h.key, h.value) for h in future.headers] == [("a", b"1"), ("b", b"x=y")]


def test_schedule_reserved_header_exits_2(capsys, fake_producer):
    code, _, err = run(capsys, *BASE, "--delay", "1", "--header", "kt-token=forged")
    assert code == 2
    assert err.startswith("timers schedule: error: header 'kt-token'")
    assert fake_producer.records == []


def test_cancel_prints_what_was_sent(capsys, fake_producer):
    code, out, _ = run(capsys, "cancel", "r-1", "--key", "1800000000")
    assert code == 0
    assert json.loads(out) == {"id": "r-1", "record_key": "1800000000", "cancel": "sent"}
    assert fake_producer.records[0].key == b"1800000000"


def test_unreachable_kafka_exits_2_with_one_line(capsys, monkeypatch):
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    code, out, err = run(capsys, *BASE, "--delay", "1", "--delivery-timeout", "500ms")
    assert code == 2
    assert out == ""
    assert err.startswith("timers: error: timer ")
    assert "was not delivered to Kafka at 127.0.0.1:1" in err
    assert "Check KAFKA_BOOTSTRAP_SERVERS" in err
    assert err.count("\n") == 1


class FakeMessage:
    def __init__(self, key, value, headers, timestamp_ms=None):
        self._key, self._value, self._headers = key, value, headers
        self._timestamp_ms = timestamp_ms

    def timestamp(self):
        if self._timestamp_ms is None:
            return TIMESTAMP_NOT_AVAILABLE, -1
        return TIMESTAMP_CREATE_TIME, self._timestamp_ms

    def partition(self):
        return 3

    def offset(self):
        return 17

    def key(self):
        return self._key

    def value(self):
        return self._value

    def headers(self):
        return self._headers


def test_watch_output_shows_lateness_of_a_callback_whenever_it_is_read():
    msg = FakeMessage(
        b"order-42",
        b"\xff\x00",
        [("kt-id", b"r-1"), ("kt-due-ms", b"1800000000000"), ("kt-fired-ms", b"1800000000040"), ("x", None)],
        timestamp_ms=1_800_000_000_250,
    )
    out = record_json(msg)
    assert out == {
        "partition": 3,
        "offset": 17,
        "key": "order-42",
        "value": "b'\\xff\\x00'",
        "headers": {"kt-id": "r-1", "kt-due-ms": "1800000000000", "kt-fired-ms": "1800000000040", "x": None},
        "due": "2027-01-15T08:00:00.000Z",
        "lateness_ms": 250,
        "fire_delay_ms": 40,
    }


def test_watch_output_of_a_plain_record_has_no_lateness():
    out = record_json(FakeMessage(None, b"hello", None))
    assert out == {"partition": 3, "offset": 17, "key": None, "value": "hello", "headers": {}}


def test_watch_into_a_reader_that_stops_early_ends_quietly_with_status_0():
    # `timers watch TOPIC | head -1`: the records printed after head has exited hit a closed pipe.
    code = (
        "import sys\n"
        "from futures import cli\n"
        "from futures.console import output, watch\n"
        "def records(args):\n"
        "    for offset in range(100_000):\n"
        "        output.print_json({'offset': offset})\n"
        "    return 0\n"
        "watch._watch = records\n"
        "sys.exit(cli.main(['watch', 'cb-orders']))\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO
    )
    assert child.stdout is not None and child.stderr is not None
    assert json.loads(child.stdout.readline()) == {"offset": 0}
    child.stdout.close()  # what head does once it has its line

    assert child.wait(timeout=30) == 0
    assert child.stderr.read().decode() == ""


def test_cancel_timeout_without_wait_exits_2(capsys, fake_producer):
    code, out, err = run(capsys, "cancel", "r-1", "--timeout", "5s")
    assert (code, out) == (2, "")
    assert "timers cancel: error: --timeout is how long --wait waits: give --wait too" in err
    assert fake_producer.records == []


def sent_future(producer: FakeProducer) -> Future:
    (record,) = producer.records
    return Future.FromString(record.value)


def test_schedule_every_sends_a_series_one_interval_from_now(capsys, fake_producer):
    before = time.time()
    code, out, err = run(capsys, *BASE, "--every", "1m30s", "--max-count", "3", "--id", "tick")
    assert (code, err) == (0, "")
    printed = json.loads(out)
    future = sent_future(fake_producer)
    assert (future.recurrence.interval_ms, future.recurrence.max_count) == (90_000, 3)
    assert future.due_ms == printed["due_ms"]
    assert abs(printed["due_ms"] - (before + 90) * 1000) < 2000
    assert printed["series"] == {
        "cron": None,
        "time_zone": None,
        "interval_ms": 90_000,
        "until_ms": None,
        "max_count": 3,
    }


def test_schedule_cron_starts_at_its_next_match_in_its_zone(capsys, fake_producer):
    code, out, _ = run(capsys, *BASE, "--cron", "30 9 * * *", "--tz", "Europe/Paris")
    assert code == 0
    future = sent_future(fake_producer)
    assert (future.recurrence.cron, future.recurrence.time_zone) == ("30 9 * * *", "Europe/Paris")
    due = datetime.fromtimestamp(future.due_ms / 1000, ZoneInfo("Europe/Paris"))
    assert (due.hour, due.minute) == (9, 30)
    assert 0 < future.due_ms / 1000 - time.time() <= 86400
    assert json.loads(out)["series"]["time_zone"] == "Europe/Paris"


@FUZZ
@given(
    option=st.sampled_from(["--every", "--cron", "--tz", "--until", "--max-count", "--delay", "--at"]),
    text=st.text(max_size=40) | st.sampled_from(["@daily", "*/0 * * * *", "1e400", "nan", "0 0 30 2 *"]),
)
def test_any_schedule_option_value_schedules_or_says_what_to_fix(option, text):
    """Whatever is typed: a timer (status 0) or one line saying what to fix (status 2)."""
    producer = FakeProducer()
    argv = [*BASE, option, text]
    if option in ("--tz", "--until", "--max-count"):
        argv += ["--cron", "@daily"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(connect, "client", lambda _, timeout: TimerClient(CommonConfig(), producer=producer))
        patch.setattr(schedule, "warn_if_missing", lambda common, topic: None)
        errors = io.StringIO()
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
    assert code in (0, 2)
    if code == 2:
        assert errors.getvalue().count("\n") == 1
        assert producer.records == []
