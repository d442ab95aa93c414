"""The environment listing every console script's ``--help`` ends with."""

from __future__ import annotations

from ktimers.cli import env_help
from ktimers.config import NO_DEFAULT, EnvVar


def test_each_variable_starts_a_line_and_its_default_is_never_split() -> None:
    text = env_help(
        [
            ("environment, shared", [EnvVar("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092", "brokers")]),
            (
                "environment, worker",
                [
                    EnvVar("TIMERS_X", "0 (none)", "a meaning long enough to be wrapped " * 2),
                    EnvVar("TIMERS_Y", NO_DEFAULT, "no default shown"),
                ],
            ),
        ],
        width=60,
    )
    lines = text.splitlines()
    assert lines[0] == "environment, shared:"
    assert lines[1] == "  KAFKA_BOOTSTRAP_SERVERS  brokers [default: 127.0.0.1:9092]"
    assert "environment, worker:" in lines
    assert all(len(line) <= 60 for line in lines)
    assert "[default: 0 (none)]" in text
    assert "  TIMERS_Y                 no default shown" in lines
