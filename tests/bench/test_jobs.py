"""`make bench-jobs` keeps working: a tiny run compacts its log once per master and reports a row each.

Figures are not asserted (the machine running the tests is not quiet), only that every request
row the log holds was read and the report says so. It runs as ``make bench-jobs`` does, in a
process of its own: each measurement starts and stops its own SparkSession, which in this
process would stop the session the Spark tests share.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.cluster import REPO

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
def test_a_small_jobs_run_reports_a_row_per_master(tmp_path: Path) -> None:
    out = tmp_path / "docs"
    argv = [sys.executable, "-m", "bench.jobs", "--records", "2000", "--masters", "local[1]"]
    argv += ["--out", str(out)]
    run = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=280, check=False)  # noqa: S603
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line for line in (out / "BENCHMARKS.md").read_text().splitlines() if line.startswith("| local[")]
    assert len(rows) == 1
    cells = rows[0].split(" | ")
    assert cells[0] == "| local[1]"
    assert cells[1] == "2,000"  # request rows read: every record of the log
