"""`make bench-capacity` keeps working: a tiny run shows a row per size in BENCHMARKS.md.

Figures are not asserted (the machine running the tests is not quiet), only that every
hot second was received in full, none early, and the report says so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.capacity import main

pytestmark = pytest.mark.integration


@pytest.mark.timeout(240)
def test_a_small_capacity_run_reports_every_size(tmp_path: Path) -> None:
    out = tmp_path / "docs"
    status = main(
        ["--pending", "300,1000", "--hot", "200", "--repeat", "1", "--out", str(out), "--work", str(tmp_path)]
    )
    assert status == 0
    rows = [
        line
        for line in (out / "BENCHMARKS.md").read_text().splitlines()
        if line.startswith("| ") and "pending |" not in line
    ]
    assert [row.split(" | ")[0] for row in rows] == ["| 0", "| 300", "| 1,000"]
    for row in rows:
        cells = row.split(" | ")
        assert cells[4].endswith(" GB")  # the compaction the worker's tables owed, from its metrics
        assert cells[6].startswith("**") and "/s**" in cells[6]  # a rate for the hot second
        assert cells[9] == "0"  # none early
