"""`make bench-jobs` keeps working: a tiny run compacts its log once per master and reports a row each.

Figures are not asserted (the machine running the tests is not quiet), only that every request
row the log holds was read and the report says so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.jobs import main

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
def test_a_small_jobs_run_reports_a_row_per_master(tmp_path: Path) -> None:
    out = tmp_path / "docs"
    assert main(["--records", "2000", "--masters", "local[1]", "--out", str(out)]) == 0
    rows = [line for line in (out / "BENCHMARKS.md").read_text().splitlines() if line.startswith("| local[")]
    assert len(rows) == 1
    cells = rows[0].split(" | ")
    assert cells[0] == "| local[1]"
    assert cells[1] == "2,000"  # request rows read: every record of the log
