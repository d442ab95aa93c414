"""The job commands: bad arguments and errors are one line on stderr and status 2 (before Spark
starts, where they can be told then)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from futures.jobs import compact, replay, report
from futures.jobs.runner import JobParser, instant_ms, run_main
from futures.jobs.session import resolve_master


def test_replay_to_topic_needs_a_due_window(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        replay.main(["--from-log", "--to-topic", "orders-retry", "--due-from", "2026-11-23T09:00:00Z"]) == 2
    )
    assert capsys.readouterr().err.strip() == (
        "timers-replay: error: --to-topic re-sends callbacks of a due window: give --due-from and --due-to"
    )


def test_replay_needs_a_source_and_zoned_times(capsys: pytest.CaptureFixture[str]) -> None:
    assert replay.main([]) == 2
    assert "one of the arguments --snapshot --from-log is required" in capsys.readouterr().err
    assert replay.main(["--from-log", "--due-from", "2026-11-23T09:00:00"]) == 2
    assert "has no zone" in capsys.readouterr().err


def test_unknown_options_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert compact.main(["--publsh", "x"]) == 2
    assert "unrecognized arguments: --publsh x" in capsys.readouterr().err
    assert report.main(["--bucket", "week"]) == 2
    assert "invalid choice: 'week'" in capsys.readouterr().err


def test_an_error_raised_in_a_spark_task_is_reported_as_its_own_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def job(_args) -> int:
        raise PySparkException(
            message="An exception was thrown from the Python worker:\nTraceback ...\n"
            "futures.jobs.errors.SourceError: timer-request[3]: no record for 60s at offset 7\n  at org..."
        )

    parser = JobParser(prog="timers-compact")
    parser.add_argument("--quiet", action="store_true")
    assert run_main("timers-compact", parser, job, []) == 2
    assert capsys.readouterr().err.strip() == (
        "timers-compact: error: timer-request[3]: no record for 60s at offset 7"
    )


def test_master_defaults_to_local_unless_spark_submit_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    assert resolve_master(None) == "local[*]"
    assert resolve_master("spark://h:7077") == "spark://h:7077"
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "40000")
    assert resolve_master(None) is None


def test_replay_refuses_to_resend_callbacks_of_timers_not_yet_due(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--from-log", "--to-topic", "orders-retry", "--due-from", "2026-11-23T09:00:00Z"]
    assert replay.main([*args, "--due-to", "2999-01-01T00:00:00Z"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        "timers-replay: error: --due-to 2999-01-01T00:00:00.000Z is in the future, "
        "and a timer never fires early"
    )
    assert "(--due-to now)" in err and "re-publish them to timer-request" in err


def test_now_is_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time_ns", lambda: 1_795_000_000_123_456_789)
    assert instant_ms("now") == instant_ms(" NOW ") == 1_795_000_000_123


@pytest.fixture
def shared_spark(spark: SparkSession, monkeypatch: pytest.MonkeyPatch) -> SparkSession:
    """The session of this test process, which a job's main() gets and must not stop: it stops
    its session when done, as its own process would, and the other tests of the file need it."""
    monkeypatch.setattr(SparkSession, "stop", lambda self: None)
    return spark


def closed_port() -> int:
    with socket.socket() as sock:  # bound then closed: nothing listens there
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_compact_with_brokers_that_do_not_answer_is_one_line(
    shared_spark: SparkSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    port = closed_port()
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", f"127.0.0.1:{port}")

    assert compact.main(["--out", str(tmp_path / "snapshot"), "--quiet", "--master", "local[2]"]) == 2

    [line] = capfd.readouterr().err.strip().splitlines()
    assert line.startswith(f"timers-compact: error: cannot reach Kafka at 127.0.0.1:{port} within")
    assert line.endswith(
        "Check KAFKA_BOOTSTRAP_SERVERS, the KAFKA_* security settings and that the brokers are up"
    )


def test_a_snapshot_path_that_does_not_exist_is_said_so(
    shared_spark: SparkSession, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-snapshot"

    argv = ["--base", str(missing), "--out", str(tmp_path / "snapshot"), "--quiet", "--master", "local[2]"]
    assert compact.main(argv) == 2

    [line] = capfd.readouterr().err.strip().splitlines()
    assert line == (
        f"timers-compact: error: there is no snapshot at {missing}: the path does not exist. Check it "
        "(a snapshot is the --out directory of a timers-compact run)"
    )
