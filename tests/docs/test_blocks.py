"""Every code block of the README, docs/ and the chart's README runs, so no snippet can rot.

``python`` blocks are executed, each on its own, against the embedded broker with a worker and
an oscillator running: the environment gives them ``KAFKA_BOOTSTRAP_SERVERS`` and the stack's
topic names, as a reader's shell would after ``timers broker``. Shell blocks (``bash``, ``sh``,
``console``) are parsed by ``bash -n``, and run when every command in them is safe
(``--help``, ``timers watch … --timeout``, ``timers schedule``, …). ``yaml`` and ``json`` blocks
are parsed (the chart README's values are validated by the chart's schema); ``text`` blocks are
output or fragments, and skipped. A block of any other language, or of none, fails: say what it is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.docs.blocks import (
    DATA,
    LANGUAGES,
    PAGES,
    PYTHON,
    REPO,
    SHELL,
    Block,
    blocks,
    is_safe,
    shell_script,
)
from tests.integration.conftest import Stack, fresh_env
from tests.processes import Service

pytestmark = pytest.mark.integration

#: A block may schedule a timer and wait for its callback: a few seconds, more on a loaded machine.
BLOCK_TIMEOUT_S = 120.0
CHART_README = REPO / "helm" / "kafka-timers" / "README.md"


def page_blocks(page: Path) -> list[Block]:
    return blocks(page.read_text(), page)


def page_id(page: Path) -> str:
    return str(page.relative_to(REPO))


@pytest.fixture(scope="module")
def docs_stack(broker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One worker and one oscillator for every block, with the service's default limits."""
    logs = tmp_path_factory.mktemp("docs-stack")
    services: list[Service] = []

    def spawn(name: str, args: list[str], env: dict[str, str], start: bool = True) -> Service:
        service = Service(name, [sys.executable, *args], env, logs / f"{name}.log")
        services.append(service)
        return service.start() if start else service

    stack = Stack(env=fresh_env(broker_env, settings={}), spawn=spawn, data_dir=logs / "worker-data")
    try:
        stack.start_worker()
        stack.start_oscillator()
        yield stack
    finally:
        stack.close()
        for service in services:
            service.stop(timeout_s=10)


def reader_env(stack: Stack) -> dict[str, str]:
    """What a reader's shell holds: our commands on the PATH, this tree importable, the stack's settings."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    python_path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, **stack.env, "PATH": path, "PYTHONPATH": python_path}


def run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S, check=False
    )


def run_python(block: Block, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    script = cwd / f"block-{block.line}.py"
    script.write_text(block.code)
    return run([sys.executable, str(script)], env, cwd)


def run_shell(script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return run(["bash", "-euo", "pipefail", "-c", script], env, cwd)


def check_syntax(block: Block) -> None:
    script = shell_script(block)
    parsed = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, check=False)
    assert parsed.returncode == 0, f"{block.where}: not valid bash:\n{parsed.stderr}"


def check_data(block: Block) -> None:
    if block.language == "json":
        json.loads(block.code)
        return
    values = yaml.safe_load(block.code)
    if block.page == CHART_README:
        import helm_python  # the dev extra's Helm SDK: only the chart's values need it

        with helm_python.Chart.load(CHART_README.parent) as chart:
            chart.validate_schema(values)


def test_every_page_is_covered() -> None:
    """New pages join by living in docs/; the front door and the chart's README are named."""
    assert {page_id(p) for p in PAGES} >= {
        "README.md",
        "docs/architecture.md",
        "docs/configuration.md",
        "docs/jobs.md",
        "docs/operations.md",
        "docs/wire.md",
        "helm/kafka-timers/README.md",
    }


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_block_says_what_it_is(page: Path) -> None:
    unknown = [
        f"{b.where} ({b.language or 'none'})" for b in page_blocks(page) if b.language not in LANGUAGES
    ]
    assert unknown == [], f"give these blocks one of {sorted(LANGUAGES)}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_the_blocks_of_a_page_run(page: Path, docs_stack: Stack, tmp_path: Path) -> None:
    """In page order, as a reader would try them; a failure names the block's line."""
    env = reader_env(docs_stack)
    for block in page_blocks(page):
        if block.language in PYTHON:
            done = run_python(block, env, tmp_path)
            assert done.returncode == 0, f"{block.where} failed:\n{done.stdout}\n{done.stderr}"
        elif block.language in SHELL:
            check_syntax(block)
            script = shell_script(block)
            if is_safe(script):
                done = run_shell(script, env, tmp_path)
                assert done.returncode == 0, f"{block.where} failed:\n{done.stdout}\n{done.stderr}"
        elif block.language in DATA:
            check_data(block)


def test_the_first_timer_of_the_readme_fires(docs_stack: Stack, tmp_path: Path) -> None:
    """The README's first timer, pasted as it is, delivers its callback where the README says."""
    readme = page_blocks(REPO / "README.md")
    [first] = [b for b in readme if b.language in PYTHON][:1]
    [watch] = [b for b in readme if b.language == "console" and "timers watch" in b.code][:1]
    [create] = [b for b in readme if b.language in SHELL and "topics create --callback" in b.code][:1]
    env = reader_env(docs_stack)
    created = run_shell(shell_script(create), env, tmp_path)
    assert created.returncode == 0, created.stderr
    scheduled = run_python(first, env, tmp_path)
    assert scheduled.returncode == 0, scheduled.stderr
    watched = run_shell(shell_script(watch), env, tmp_path)
    assert watched.returncode == 0, watched.stderr
    callback = json.loads(watched.stdout.splitlines()[0])
    assert (callback["key"], callback["value"]) == ("greeting", "hello, timers")
    assert callback["lateness_ms"] >= 0
