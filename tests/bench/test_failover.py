"""``make failover``'s breakdown: when the worker taking over logged each step, after the kill."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from bench.failover import LAST_STEP, Round, log_steps, steps
from bench.render import failover_block
from bench.results import FailoverRun


def report(rounds: list[Round]) -> list[str]:
    """The step table `make failover` writes into FAILOVER.md for ``rounds``."""
    run = FailoverRun("cmd", "now", "broker", 1, 100, "settings", "0", "0", 2, steps=steps(rounds))
    return failover_block(run)


def epoch_ms(text: str) -> int:
    return round(datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f").timestamp() * 1000)


def test_a_restart_round_is_broken_down_by_the_new_workers_log(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_text(
        "TIMERS_INSTANCE_ID is ignored on the embedded broker\n"
        "[2026-11-24 03:15:29,604] [1] [INFO] [^Worker]: Starting... \n"
        "[2026-11-24 03:15:29,661] [1] [INFO] (Re-)joining group g \n"
        "+Topic Partition Set-----+\n"
        "[2026-11-24 03:15:32,673] [1] [INFO] Joined group 'g' (generation 6) with member_id m \n"
        "[2026-11-24 03:15:32,692] [1] [INFO] [^---Recovery]: Worker ready \n"
        "[2026-11-24 03:15:40,000] [1] [INFO] Joined group 'g' (generation 7) with member_id m \n"
    )
    killed = epoch_ms("2026-11-24 03:15:29.090")

    found = log_steps(log, "restart", killed)

    # The first line of each step after the kill; a later rejoin does not move it.
    assert list(found.values()) == [514, 571, 3583, 3602]
    lines = report([Round("restart", [0], {0: 3700}, found), Round("restart", [0], {0: 3900}, found)])
    assert "| restart | JoinGroup answered | 3.58 | 3.58–3.58 |" in lines
    assert f"| restart | {LAST_STEP} | 3.80 | 3.70–3.90 |" in lines


def test_a_step_missing_from_a_log_shows_no_figure(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_text("[2026-11-24 03:15:32,673] [1] [INFO] Joined group 'g' (generation 6) with member_id m \n")
    found = log_steps(log, "takeover", epoch_ms("2026-11-24 03:15:29.090"))

    lines = report([Round("takeover", [0], {0: 9000}, found)])

    assert "| takeover | JoinGroup answered | 3.58 | 3.58–3.58 |" in lines
    assert any(line.startswith("| takeover | the dead member dropped") and "| — |" in line for line in lines)
