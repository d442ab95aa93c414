"""The client on the lowest versions its ranges admit, not only on the versions the suite pins.

pyproject.toml lets an application keep confluent-kafka, protobuf, tzdata, rocksdict and
prometheus-client anywhere in their ranges; constraints-lowest.txt locks each at the floor of its
range (make constraints). This test installs that lock, by hash, into build/lowest (kept while the
lock is unchanged) and runs the client's tests there on this checkout: the wire's encode and
decode, the requests and their framing for a schema registry, the token guard, and the producer
against the embedded broker.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tomllib
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent
LOCK = REPO / "constraints-lowest.txt"
LOWEST = REPO / "build" / "lowest"
TESTS = ["tests/ktimers/test_wire.py", "tests/client", "tests/integration/test_client_integration.py"]
#: Compares ktimers/timers_pb2.py with what grpc_tools (a build tool, not in the lock) generates from
#: proto/: it runs in the suite; what the client does with the generated code runs here.
DESELECTED = ["tests/ktimers/test_wire.py::test_generated_code_matches_the_schema"]


def _floors() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = [*project["dependencies"]]
    for extra in ("guard", "oscillator", "registry"):
        lines += project["optional-dependencies"][extra]
    floors = {}
    for line in lines:
        requirement = Requirement(line)
        (floor,) = (spec.version for spec in requirement.specifier if spec.operator == ">=")
        floors[canonicalize_name(requirement.name)] = floor
    return floors


@pytest.fixture(scope="module")
def lowest_python() -> Path:
    """build/lowest's interpreter, with constraints-lowest.txt installed (built once per lock)."""
    python = LOWEST / "bin" / "python"
    stamp = LOWEST / ".locked"
    digest = hashlib.sha256(LOCK.read_bytes()).hexdigest()
    if not (python.exists() and stamp.exists() and stamp.read_text() == digest):
        venv.EnvBuilder(clear=True, with_pip=True).create(LOWEST)
        install = [str(python), "-m", "pip", "install", "--quiet", "--require-hashes", "-r", str(LOCK)]
        result = subprocess.run(install, capture_output=True, text=True, timeout=240, check=False)
        assert result.returncode == 0, f"installing {LOCK.name} into {LOWEST}:\n{result.stderr}"
        stamp.write_text(digest)
    return python


def test_the_lowest_versions_are_the_floors_of_the_ranges(lowest_python: Path) -> None:
    floors = _floors()
    code = "import json, sys, importlib.metadata as m\n"
    code += "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
    out = subprocess.run(
        [str(lowest_python), "-c", code, *floors], capture_output=True, text=True, check=True, timeout=60
    )
    assert {canonicalize_name(n): v for n, v in json.loads(out.stdout).items()} == floors


def test_the_client_tests_pass_on_the_lowest_versions(lowest_python: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHON"))}
    env["PYTHONPATH"] = str(REPO)  # this checkout, its compiled modules built in place (make venv)
    deselect = [arg for test in DESELECTED for arg in ("--deselect", test)]
    command = [str(lowest_python), "-m", "pytest", "-n", "0", "-q", "-p", "no:cacheprovider", *deselect]
    result = subprocess.run(
        [*command, *TESTS], cwd=REPO, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    summary = result.stdout.strip().splitlines()[-1]
    # Everything collected ran: no test skipped for a missing module, only the one named above left out.
    assert re.search(r"\d+ passed", summary), summary
    assert f"{len(DESELECTED)} deselected" in summary, summary
    assert not re.search(r"skipped|xfail|error", summary), summary
