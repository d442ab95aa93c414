"""Every console script answers ``--help`` and ``--version`` without connecting to anything.

The environment variables its ``--help`` lists come from one list per component,
next to the ``from_env`` that reads them; these tests check that each list names
exactly what ``from_env`` reads, that its defaults are the real ones, and that it
matches the tables of docs/configuration.md.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from futures.jobs.config import JOB_ENV, JobConfig
from futures.tasks.config import TASKS_ENV, TaskConfig
from futures.worker.config import WORKER_ENV, WorkerConfig
from ktimers.config import COMMON_ENV, LOG_LEVEL_ENV, NO_DEFAULT, SHARED_ENV, CommonConfig, EnvVar
from oscillator.config import OSCILLATOR_ENV, OscillatorConfig

REPO = Path(__file__).resolve().parents[1]
#: Generous for a loaded shared machine: the point is that they exit at all (the worker
#: and the oscillator used to start on --help and retry 127.0.0.1:9092 until killed).
EXIT_WITHIN_S = 20.0


class Recording(Mapping[str, str]):
    """An empty environment that remembers every variable asked for."""

    def __init__(self) -> None:
        self.read: set[str] = set()

    def __getitem__(self, name: str) -> str:
        self.read.add(name)
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


@dataclass(frozen=True)
class Component:
    scripts: tuple[str, ...]
    #: What its --help lists.
    env: tuple[EnvVar, ...]
    #: Builds its config from an environment, as the component does at start.
    from_env: Callable[[Mapping[str, str]], Any]
    #: Listed variables its entry point reads itself, outside ``from_env``.
    read_by_main: frozenset[str] = frozenset()


def _tasks_from_env(env: Mapping[str, str]) -> tuple[CommonConfig, TaskConfig]:
    # A TaskRegistry builds both (futures/tasks/registry.py).
    return CommonConfig.from_env(env), TaskConfig.from_env(env)


COMPONENTS = {
    "client": Component(("timers",), COMMON_ENV, CommonConfig.from_env),
    "oscillator": Component(("timers-oscillator",), SHARED_ENV + OSCILLATOR_ENV, OscillatorConfig.from_env),
    "worker": Component(
        ("timers-worker",), SHARED_ENV + WORKER_ENV, WorkerConfig.from_env, frozenset({LOG_LEVEL_ENV.name})
    ),
    "tasks": Component(
        ("timers-tasks",), SHARED_ENV + TASKS_ENV, _tasks_from_env, frozenset({LOG_LEVEL_ENV.name})
    ),
    "jobs": Component(
        ("timers-compact", "timers-replay", "timers-report"), COMMON_ENV + JOB_ENV, JobConfig.from_env
    ),
}
SCRIPTS = {script: c for c in COMPONENTS.values() for script in c.scripts}


def test_every_console_script_is_covered() -> None:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert sorted(declared) == sorted(SCRIPTS)


@pytest.fixture(scope="module")
def offline_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """An environment whose Kafka is a closed port on 127.0.0.1 and whose data dir must stay unmade."""
    with socket.socket() as held:  # bound, never listening: connections are refused, nobody else gets it
        held.bind(("127.0.0.1", 0))
        data_dir = tmp_path_factory.mktemp("offline") / "data"
        yield {
            **os.environ,
            "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{held.getsockname()[1]}",
            "TIMERS_DATA_DIR": str(data_dir),
        }
        assert not data_dir.exists(), "a --help or --version run created the data dir"


def run(script: str, args: Sequence[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).with_name(script)), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=EXIT_WITHIN_S,
        check=False,
    )


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_help_lists_the_environment_and_exits_without_connecting(
    script: str, offline_env: dict[str, str], tmp_path: Path
) -> None:
    done = run(script, ["--help"], offline_env, tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith(f"usage: {script} ")
    for var in SCRIPTS[script].env:
        assert re.search(rf"^  {var.name} ", done.stdout, re.MULTILINE), f"{var.name} missing from --help"
        if var.default != NO_DEFAULT:
            assert f"[default: {var.default}]" in done.stdout
    assert list(tmp_path.iterdir()) == []  # nothing written where it ran (no Spark warehouse, no tables)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_version_is_the_package_version(script: str, offline_env: dict[str, str], tmp_path: Path) -> None:
    done = run(script, ["--version"], offline_env, tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        f"kafka-timers {metadata.version('kafka-timers')}\n",
        "",
    )


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_a_bad_option_is_one_line_and_status_2(
    script: str, offline_env: dict[str, str], tmp_path: Path
) -> None:
    done = run(script, ["--no-such-option"], offline_env, tmp_path)
    assert done.returncode == 2
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(f"{script}: error: ")
    assert line.endswith(f"(see: {script} --help)")


@pytest.mark.parametrize("component", sorted(COMPONENTS))
def test_help_lists_exactly_what_the_component_reads(component: str) -> None:
    spec = COMPONENTS[component]
    env = Recording()
    spec.from_env(env)
    listed = [var.name for var in spec.env]
    assert len(set(listed)) == len(listed)
    assert env.read == set(listed) - spec.read_by_main


@pytest.mark.parametrize("component", sorted(COMPONENTS))
def test_the_listed_defaults_are_the_real_ones(component: str) -> None:
    spec = COMPONENTS[component]
    unset = spec.from_env({})
    for var in spec.env:
        value = var.default.split(" (")[0]  # "0 (none)": the value, then what it means
        if value in (NO_DEFAULT, "any") or value.startswith("<"):
            continue  # not a value one could set
        assert _effective(spec.from_env({var.name: value})) == _effective(unset), (
            f"{var.name}={value} is not its default"
        )


def _effective(config: object) -> object:
    """What a config means: the worker's group timeouts unset follow the profile (same values)."""
    if isinstance(config, WorkerConfig):
        unresolved = replace(config, session_timeout_s=None, heartbeat_s=None, rebalance_timeout_s=None)
        return unresolved, config.group_timeouts
    return config


def _doc_tables() -> dict[str, list[tuple[str, str]]]:
    """The tables of docs/configuration.md: the line above each → its (variable, default) rows."""
    text = (REPO / "docs" / "configuration.md").read_text()
    section = text.split("\n## Variables\n")[1].split("\n## ")[0]
    tables: dict[str, list[tuple[str, str]]] = {}
    intro = ""
    rows: list[tuple[str, str]] | None = None
    for line in section.splitlines():
        if not line.startswith("|"):
            rows = None
            if line.strip():
                intro = line
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[0] == "variable" or set(cells[0]) <= {"-"}:
            rows = tables.setdefault(intro, [])
            continue
        assert rows is not None
        names = re.findall(r"`([A-Z_]+)`", cells[0])
        # `KAFKA_SASL_MECHANISM` / `_USERNAME`: the prefix of the first name.
        names = [names[0].rsplit("_", 1)[0] + n if n.startswith("_") else n for n in names]
        values = re.findall(r"`([^`]*)`", cells[1])
        if len(names) == 1 or len(values) != len(names):
            values = [cells[1].replace("`", "")] * len(names)
        rows.extend(zip(names, values, strict=True))
    return tables


DOC_TABLES = {
    "Everything reads the environment. Shared by all components:": SHARED_ENV,
    "Worker (`timers-worker`):": WORKER_ENV,
    "Oscillator (`timers-oscillator`):": OSCILLATOR_ENV,
    "Task worker (`timers-tasks`": TASKS_ENV,
    "Jobs (`timers-compact`": JOB_ENV,
}


def test_the_lists_match_the_configuration_page() -> None:
    tables = _doc_tables()
    assert len(tables) == len(DOC_TABLES)
    for intro, variables in DOC_TABLES.items():
        [documented] = [rows for line, rows in tables.items() if line.startswith(intro)]
        assert documented == [(var.name, var.default) for var in variables], intro


#: The scripts that need an extra: (the extra, a module of it that a base install lacks).
NEEDS_EXTRA = {
    "timers-worker": ("worker", "faust"),
    "timers-oscillator": ("oscillator", "prometheus_client"),
    "timers-compact": ("jobs", "pyspark"),
    "timers-replay": ("jobs", "pyspark"),
    "timers-report": ("jobs", "pyspark"),
}
#: Those whose --help needs none of their extra (the jobs' options are defined with the jobs).
HELP_WITHOUT_EXTRA = {"timers-worker", "timers-oscillator"}


def run_without(
    module: str, script: str, args: Sequence[str], env: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    """``script`` as pyproject.toml declares it, in an install where ``module`` is missing."""
    target = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"][script]
    where, function = target.split(":")
    code = (
        f"import sys\nsys.modules[{module!r}] = None  # import {module} fails as if not installed\n"
        f"from {where} import {function}\nsys.exit({function}())\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env={**env, "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=EXIT_WITHIN_S,
        check=False,
    )


@pytest.mark.parametrize("script", sorted(NEEDS_EXTRA))
def test_without_its_extra_a_script_names_the_extra_to_install(
    script: str, offline_env: dict[str, str], tmp_path: Path
) -> None:
    extra, module = NEEDS_EXTRA[script]

    done = run_without(module, script, [], offline_env, tmp_path)

    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines() == [
        f"{script}: error: {script} needs the {extra} install: the Python module {module!r} is not "
        f"installed: pip install 'kafka-timers[{extra}]'"
    ]


@pytest.mark.parametrize("script", sorted(NEEDS_EXTRA))
def test_help_without_the_extra_is_the_help_or_the_extra_to_install(
    script: str, offline_env: dict[str, str], tmp_path: Path
) -> None:
    extra, module = NEEDS_EXTRA[script]

    done = run_without(module, script, ["--help"], offline_env, tmp_path)

    if script in HELP_WITHOUT_EXTRA:
        assert (done.returncode, done.stderr) == (0, "")
        assert done.stdout.startswith(f"usage: {script} ")
    else:
        assert done.returncode == 2
        assert f"pip install 'kafka-timers[{extra}]'" in done.stderr
        assert "Traceback" not in done.stderr
