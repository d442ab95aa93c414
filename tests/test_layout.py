"""Dependencies point down: each part imports only what it may.

The client, the ingress parsers, the jobs, the tasks and the oscillator are
imported in a fresh interpreter and the modules that got loaded are checked;
the source is also scanned, so an import hidden inside a function (loaded only
when it runs, e.g. in a Spark task) is caught too.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

WORKER = ("futures.worker",)
FRAMEWORKS = ("faust", "mode", "aiokafka", "rocksdict", "prometheus_client")

#: part -> (what to import, module prefixes it must never load)
PARTS: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "client": (
        ["futures.client", "futures.client.guard", "futures.cli"],
        WORKER + FRAMEWORKS + ("futures.ingress", "futures.jobs", "pyspark"),
    ),
    "ingress": (["futures.ingress.requests"], WORKER + FRAMEWORKS + ("confluent_kafka", "pyspark")),
    "jobs": (
        [
            "futures.jobs.compact",
            "futures.jobs.replay",
            "futures.jobs.report",
            "futures.jobs.decode",
            "futures.jobs.outputs",
        ],
        WORKER + FRAMEWORKS,
    ),
    "tasks": (["futures.tasks.worker", "futures.tasks.registry"], WORKER + FRAMEWORKS),
    "oscillator": (["oscillator.main", "oscillator.service"], ("futures",) + FRAMEWORKS[:-1]),
    "ktimers": (
        ["ktimers.wire", "ktimers.config", "ktimers.topics", "ktimers.deadletter", "ktimers.producer"],
        ("futures", "oscillator") + FRAMEWORKS,
    ),
}

#: part -> the source folders whose every import (also inside functions) is checked
SOURCES = {
    "client": ["futures/client", "futures/console"],
    "ingress": ["futures/ingress"],
    "jobs": ["futures/jobs"],
    "tasks": ["futures/tasks"],
    "oscillator": ["oscillator"],
    "ktimers": ["ktimers"],
}


def _forbidden(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("part", sorted(PARTS))
def test_a_part_loads_none_of_the_modules_below_it_must_not_use(part: str) -> None:
    imports, forbidden = PARTS[part]
    code = (
        "import importlib, json, sys\n"
        f"for name in {imports!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout)
    assert [m for m in loaded if _forbidden(m, forbidden)] == []


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
    return found


@pytest.mark.parametrize("part", sorted(SOURCES))
def test_no_module_of_a_part_imports_what_it_must_not_even_lazily(part: str) -> None:
    _, forbidden = PARTS[part]
    # The guard's RocksDB backend imports rocksdict when it is used, by design (the `guard` extra).
    allowed = {("futures/client/guard.py", "rocksdict")}
    bad = [
        f"{path.relative_to(REPO)}:{line}: {module}"
        for folder in SOURCES[part]
        for path in sorted((REPO / folder).rglob("*.py"))
        for line, module in _imports(path)
        if _forbidden(module, forbidden) and (str(path.relative_to(REPO)), module) not in allowed
    ]
    assert bad == []


def test_the_scan_sees_an_import_hidden_in_a_function(tmp_path: Path) -> None:
    source = tmp_path / "lazy.py"
    source.write_text("def f():\n    from futures.worker.engine import TimerEngine\n    return TimerEngine\n")
    assert _imports(source) == [(2, "futures.worker.engine")]


def test_every_source_folder_is_a_regular_package():
    """A folder of modules without ``__init__.py`` is a namespace package: it imports, but
    tools that find a module's package by its ``__init__.py`` (py-spy's profiles of the
    worker, used by the benchmarks) name its files without their package."""
    for root in ("futures", "ktimers", "oscillator", "bench"):
        for folder in [REPO / root, *(p for p in (REPO / root).rglob("*") if p.is_dir())]:
            if any(folder.glob("*.py")):
                assert (folder / "__init__.py").exists(), f"{folder.relative_to(REPO)} has no __init__.py"


def test_the_timers_command_is_read_one_command_at_a_time() -> None:
    """``timers`` keeps a module per command in futures/console/, each short enough to read."""
    modules = [REPO / "futures/cli.py", *sorted((REPO / "futures/console").glob("*.py"))]
    long = {str(m.relative_to(REPO)): n for m in modules if (n := len(m.read_text().splitlines())) > 400}
    assert not long, f"split these per command (over 400 lines): {long}"
