"""A benchmark stopped by SIGTERM (``timeout``, ``kill``) leaves nothing of its run behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from bench.cluster import REPO

pytestmark = pytest.mark.integration


@pytest.mark.timeout(120)
def test_a_capacity_run_stopped_by_sigterm_stops_its_broker_and_services(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "bench.capacity", "--pending", "100000", "--hot", "200", "--repeat", "1"]
    run = subprocess.Popen(  # noqa: S603 - our interpreter and module
        [*argv, "--out", str(tmp_path / "docs"), "--work", str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        bench = psutil.Process(run.pid)
        started: list[psutil.Process] = []
        deadline = time.monotonic() + 60
        # Stopped mid-run: once the broker, the worker and the oscillator are up.
        while time.monotonic() < deadline and run.poll() is None:
            started = bench.children(recursive=True)
            names = " ".join(map(_command, started))
            if "tansu" in names and "futures.worker.main" in names and "oscillator.main" in names:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"the run did not start its broker and services (exit {run.poll()})")
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=60) == 128 + signal.SIGTERM
        _, alive = psutil.wait_procs(started, timeout=30)
        assert not alive, f"still running after the run ended: {[_command(p) for p in alive]}"
    finally:
        if run.poll() is None:
            run.kill()


def _command(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""  # gone already
