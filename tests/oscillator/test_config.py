"""Oscillator settings from the environment: defaults, overrides and errors that name the variable."""

from __future__ import annotations

import os
import socket

import pytest

from ktimers.errors import ConfigError
from oscillator.config import OscillatorConfig


def test_defaults() -> None:
    config = OscillatorConfig.from_env({})

    assert config.instance == f"{socket.gethostname()}-{os.getpid()}"
    assert (config.health_host, config.health_port) == ("127.0.0.1", 8090)
    assert config.stale_after_s == 5.0
    assert config.common.topics.oscillator == "oscillator"
    assert config.log_level == "INFO"


def test_overrides() -> None:
    config = OscillatorConfig.from_env(
        {
            "TIMERS_OSC_INSTANCE": "osc-a",
            "TIMERS_OSC_HEALTH_HOST": "0.0.0.0",  # noqa: S104 - a value under test, nothing binds
            "TIMERS_OSC_HEALTH_PORT": "9100",
            "TIMERS_OSC_STALE_AFTER_S": "2.5",
            "TIMERS_TOPIC_OSCILLATOR": "ticks",
            "TIMERS_LOG_LEVEL": "debug",
        }
    )

    assert config.instance == "osc-a"
    assert (config.health_host, config.health_port) == ("0.0.0.0", 9100)  # noqa: S104
    assert config.stale_after_s == 2.5
    assert config.common.topics.oscillator == "ticks"
    assert config.log_level == "DEBUG"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("TIMERS_OSC_HEALTH_PORT", "http"),
        ("TIMERS_OSC_HEALTH_PORT", "70000"),
        ("TIMERS_OSC_STALE_AFTER_S", "1"),
        ("TIMERS_OSC_METADATA_REFRESH_S", "0"),
        ("TIMERS_LOG_LEVEL", "chatty"),
    ],
)
def test_bad_values_are_rejected_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        OscillatorConfig.from_env({name: value})
