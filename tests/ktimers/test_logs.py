from __future__ import annotations

import logging

import pytest

from ktimers.logs import ThrottledLog


def test_a_flood_is_a_few_lines_then_a_count(caplog: pytest.LogCaptureFixture):
    now = [0.0]
    log = ThrottledLog(logging.getLogger("test.throttle"), burst=3, interval_s=10, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="test.throttle"):
        for i in range(1000):
            log.warning("bad record %d", i)
        assert [r.getMessage() for r in caplog.records] == ["bad record 0", "bad record 1", "bad record 2"]
        now[0] = 10
        log.warning("bad record %d", 1000)
    assert caplog.records[-1].getMessage() == "bad record 1000 (997 similar line(s) suppressed)"
