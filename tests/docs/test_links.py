"""Every relative link of the README, docs/ and the chart README points at a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([*REPO.glob("*.md"), *(REPO / "docs").glob("*.md"), REPO / "helm/kafka-timers/README.md"])
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path) -> None:
    targets = [m.group(1) for m in LINK.finditer(page.read_text())]
    local = [t for t in targets if not re.match(r"[a-z]+:", t)]
    missing = [t for t in local if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(REPO)} links to files that do not exist: {missing}"
