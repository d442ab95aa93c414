"""`make bench` keeps working: a tiny run through every measurement writes a sane report.

The figures are never asserted (the machine running the tests is not quiet); only
that each measurement produced one, and that the report and plots say so.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench.__main__ import main

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server: make redis"),
]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
OUR_WORKLOADS = {"hot-second", "spread", "steady-100", "capacity-hot"}
PRECISE_WORKLOADS = {"precise-hot-second", "precise-300"}
#: The durable Redis is measured on its ingest, the hot second and the steady rates.
DURABLE_REDIS_WORKLOADS = {"hot-second", "steady-100"}


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    """One smoke run for the module: (exit status, output dir)."""
    out = tmp_path_factory.mktemp("bench-out")
    work = tmp_path_factory.mktemp("bench-work")
    # Like every integration test: the embedded broker, or KAFKA_BOOTSTRAP_SERVERS if set.
    status = main(["--profile", "smoke", "--out", str(out), "--work", str(work)])
    return status, out


@pytest.mark.timeout(240)
def test_every_measurement_produces_a_figure(smoke_run: tuple[int, Path]) -> None:
    status, out = smoke_run
    runs = json.loads((out / "bench" / "results.json").read_text())["runs"]
    assert len(runs) == 1
    results = runs[0]
    assert results["errors"] == [], results["errors"]
    assert status == 0
    assert results["ceiling"]["rate"] > 0
    assert results["floor"]["rate"] > 0
    # Both request paths were measured: one Future per record, and batched records.
    assert {i["path"]: i["rate"] > 0 for i in results["ingest"]} == {"single": True, "batched": True}
    fires = {(f["system"], f["workload"]): f for f in results["fires"]}
    expected = {("kafka-timers", w) for w in OUR_WORKLOADS | PRECISE_WORKLOADS}
    expected |= {("redis-zset", w) for w in OUR_WORKLOADS}
    expected |= {("redis-zset-aof", w) for w in DURABLE_REDIS_WORKLOADS}
    expected |= {("direct produce", "direct-300")}  # precise mode's rate, straight to the receiver
    assert set(fires) == expected
    for fire in fires.values():
        late = fire["lateness"]
        # Every timer of every workload came back, none before its due time.
        assert late["received"] == late["expected"] == fire["timers"], fire
        assert late["early"] == 0, fire
        assert fire["series_rate"], fire
        # Both clocks of every callback were read: at dispatch (kt-fired-ms) and at the receiver.
        assert late["fired_p99_ms"] is not None and late["p99_ms"] is not None, fire
    # The sustained-rate search ran for the worker and for the in-memory Redis design: from the
    # profile's start, the rate doubled if held and halved if not, every callback back, none early.
    sustained = {s["system"]: s for s in results["sustained"]}
    assert set(sustained) == {"kafka-timers", "redis-zset"}
    for found in sustained.values():
        first, second = found["steps"]
        assert first["rate"] == 200
        assert second["rate"] == (100 if first["failed"] else 400)
        for step in found["steps"]:
            late = step["fire"]["lateness"]
            assert late["received"] == late["expected"] == step["fire"]["timers"], step
            assert late["early"] == 0, step
    assert set(results["zadd_rates"]) == {"redis-zset", "redis-zset-aof"}
    assert all(rate > 0 for rate in results["zadd_rates"].values())
    capacity = {c["system"]: c for c in results["capacity"]}
    assert set(capacity) == {"kafka-timers", "redis-zset"}
    assert capacity["kafka-timers"]["disk_bytes"] > 0
    assert capacity["redis-zset"]["used_memory_delta"] > 0
    # Every hot second is profiled over its firing (the hook `scheduled` enters once the load is in).
    profiled = {p["phase"] for p in results["profiles"]}
    assert {"hot-second", "capacity-hot", "precise-hot-second"} <= profiled, profiled


def test_report_shows_the_tables_targets_and_plots(smoke_run: tuple[int, Path]) -> None:
    _status, out = smoke_run
    report = (out / "BENCHMARKS.md").read_text()
    headings = ("### Throughput", "### Lateness", "### Precise mode", "### Sustained rate", "### Capacity",
                "## Targets", "## Machine and versions")  # fmt: skip
    for heading in headings:
        assert heading in report
    assert "ratio to ceiling" in report
    assert "redis-zset-aof (durable)" in report
    # The targets, each with a verdict.
    assert "Fire, hot second of 500: ≥ 100 % of the Redis poller's rate" in report
    assert "Ingest, batched records ≥ 100 % of the in-memory Redis design's pipelined ZADD" in report
    assert "| Never early (every workload, both modes, every run) | 0 early of" in report
    assert "| Once: no callback received twice (no worker crashes in these runs) | 0 repeats of" in report
    assert "| precise hot second (500 timers due in one second) |" in report
    precise = report.split("<!-- results:precise -->", 1)[1].split("<!-- /results:precise -->")[0]
    assert "| direct produce: callbacks produced on their due millisecond, 300/s for " in precise
    lateness = report.split("<!-- results:lateness -->", 1)[1].split("<!-- /results:lateness -->")[0]
    assert "direct produce" not in lateness
    sustained = report.split("<!-- results:sustained -->", 1)[1].split("<!-- /results:sustained -->")[0]
    assert "| kafka-timers | " in sustained and "| redis-zset | " in sustained
    assert "Sustained rate (held 2 s, p99 at the receiver ≤ 1.1 s, second mode)" in report
    for plot in ("hot-second.png", "lateness.png", "fire-rate.png"):
        assert (out / "bench" / plot).read_bytes().startswith(PNG_MAGIC)
