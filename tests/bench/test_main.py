"""`python -m bench`'s command line: what it refuses, before anything is measured."""

from __future__ import annotations

import pytest

from bench.__main__ import main


def test_only_rejects_an_unknown_phase_and_names_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--only", "ceiling,sustaind"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--only: unknown phase sustaind" in err
    assert "ceiling, kafka-timers, capacity, precise, redis, redis-aof, sustained" in err
