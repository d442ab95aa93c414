"""timers-oscillator's start: a setting it cannot use is one line and status 2, before any broker."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ktimers.broker import free_port

REPO = Path(__file__).resolve().parents[2]


def run_oscillator(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oscillator.main"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )


@pytest.mark.parametrize("protocol", ["SSL", "SASL_SSL"])
@pytest.mark.parametrize("bundle", ["missing", "not-pem"])
def test_a_ca_bundle_it_cannot_read_is_one_line_naming_it(tmp_path: Path, protocol: str, bundle: str) -> None:
    """As the worker says it: a mounted CA Secret with the wrong key is found at start, not in a traceback."""
    ca = tmp_path / "ca.pem"
    if bundle == "not-pem":
        ca.write_text("placeholder, not a certificate\n")
    with socket.socket() as held:  # bound, never listening: no broker answers there
        held.bind(("127.0.0.1", 0))
        env = {
            **os.environ,
            "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{held.getsockname()[1]}",
            "KAFKA_SECURITY_PROTOCOL": protocol,
            "KAFKA_SASL_MECHANISM": "PLAIN",
            "KAFKA_SASL_USERNAME": "timers",
            "KAFKA_SASL_PASSWORD": "secret",
            "KAFKA_SSL_CA_LOCATION": str(ca),
            "TIMERS_OSC_HEALTH_PORT": str(free_port()),
        }
        done = run_oscillator(env)

    assert done.returncode == 2, done.stderr[-3000:]
    [line] = done.stderr.strip().splitlines()
    assert "oscillator cannot start:" in line
    assert f"KAFKA_SSL_CA_LOCATION={str(ca)!r}: cannot read a CA bundle there" in line
