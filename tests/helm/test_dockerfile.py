"""The Dockerfile, checked without a Docker engine: hadolint, and the properties the chart relies on."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helm.conftest import REPO, RenderFn, pod_spec

DOCKERFILE = REPO / "Dockerfile"


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def last(self, op: str) -> str | None:
        found = [arg for o, arg in self.instructions if o == op]
        return found[-1] if found else None

    def runs(self) -> str:
        return "\n".join(arg for op, arg in self.instructions if op == "RUN")


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, with continuation lines joined."""
    joined = re.sub(r"\\\n", " ", text)
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        op = op.upper()
        if op == "FROM":
            match = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.IGNORECASE)
            assert match, line
            stages.append(Stage(match.group(2) or str(len(stages)), match.group(1)))
        elif stages:
            stages[-1].instructions.append((op, rest))
        elif op == "ARG" and "=" in rest:
            name, _, default = rest.partition("=")
            args[name] = default
    return args, stages


ARGS, STAGES = parse(DOCKERFILE.read_text())
BY_NAME = {s.name: s for s in STAGES}


def _hadolint() -> str:
    found = Path(sys.executable).with_name("hadolint")
    return str(found) if found.exists() else shutil.which("hadolint") or "hadolint"


def test_hadolint_is_clean() -> None:
    command = [_hadolint(), "--failure-threshold", "info", str(DOCKERFILE)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_base_images_are_pinned() -> None:
    for stage in STAGES:
        if stage.base in BY_NAME:
            continue
        image = re.sub(r"\$\{(\w+)\}", lambda m: ARGS[m.group(1)], stage.base)
        name, _, tag = image.rpartition(":")
        assert name and tag and tag != "latest", f"stage {stage.name}: {image} needs an explicit tag"


@pytest.mark.parametrize("target", ["service", "jobs"])
def test_images_run_as_the_unprivileged_user_the_chart_expects(render: RenderFn, target: str) -> None:
    user = BY_NAME[target].last("USER")
    assert user is not None, f"stage {target} runs as root"
    uid = re.sub(r"\$\{(\w+)\}", lambda m: ARGS[m.group(1)], user).split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric: runAsNonRoot can verify it
    security = pod_spec(render({}).one("StatefulSet", "-worker"))["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == int(uid)


def test_services_image_is_the_default_target() -> None:
    assert STAGES[-1].name == "service"


def _installs(stage: str) -> list[str]:
    return [" ".join(line.split()) for line in BY_NAME[stage].runs().split("&&") if "pip install" in line]


@pytest.mark.parametrize("stage", ["build", "build-jobs"])
def test_every_file_pip_fetches_is_checked_by_hash(stage: str) -> None:
    """pip itself by its own hash, then everything against constraints.txt (hashes there need pip 26.1)."""
    copies = " ".join(arg for op, arg in BY_NAME["build"].instructions if op == "COPY")
    assert "constraints.txt" in copies and "requirements-pip.txt" in copies and "pyproject.toml" in copies
    installs = _installs(stage)
    assert installs
    for line in installs:
        fetches = "--no-deps" not in line or " -r " in line
        if "-r requirements-pip.txt" in line:
            assert "--require-hashes" in line, line
        elif fetches:
            assert "-c constraints.txt" in line, f"{line}: fetches files no hash checks"
        else:
            assert "/wheels/kafka_timers-" in line, f"{line}: only our own wheel installs unchecked"
    if stage == "build":
        # Each virtualenv's pip is replaced by the hashed one before it installs anything else.
        for venv in ("/opt/build/bin/pip", "pip"):
            own = [line for line in installs if line.startswith(f"{venv} install")]
            assert own and "-r requirements-pip.txt" in own[0], own
        # Our wheel is built by the hashed backend, not one an isolated build would download.
        assert "--no-build-isolation" in BY_NAME["build"].runs()
    (pip,) = re.findall(r"^pip==(\S+)", (REPO / "requirements-pip.txt").read_text(), re.MULTILINE)
    assert tuple(int(p) for p in pip.split(".")[:2]) >= (26, 1), pip


def test_dependencies_come_without_dev_tools() -> None:
    assert "[dev]" not in DOCKERFILE.read_text()


def test_dockerignore_keeps_what_the_build_copies() -> None:
    rules = [r for r in (REPO / ".dockerignore").read_text().splitlines() if r and not r.startswith("#")]
    assert rules[0] == "*", "allow-list: only what the image needs enters the build context"
    kept = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    copied = set()
    for stage in STAGES:
        for op, arg in stage.instructions:
            if op == "COPY" and not arg.startswith("--from"):
                copied.update(arg.split()[:-1])
    assert copied <= kept, copied - kept
    for package in ("ktimers", "oscillator", "futures"):
        assert package in copied


def _chain(name: str) -> list[Stage]:
    """The stage and those it is built FROM, oldest first."""
    stage = BY_NAME[name]
    return ([*_chain(stage.base)] if stage.base in BY_NAME else []) + [stage]


@pytest.mark.parametrize("target", ["service", "jobs"])
def test_images_that_run_ship_no_package_installers(target: str) -> None:
    """pip and setuptools are for building: in a running container they only widen what an intruder can do."""
    removes = re.compile(r"pip uninstall --yes pip setuptools")
    # The base image's own python: uninstalled in a stage of the target's own chain.
    system = [s.name for s in _chain(target) if removes.search(s.runs())]
    assert system, f"{target}: the base image's pip stays"
    # The virtualenv: copied from a stage that removes them after its last install.
    (copy,) = [arg for op, arg in BY_NAME[target].instructions if op == "COPY" and "/opt/kafka-timers" in arg]
    source = re.fullmatch(r"--from=(\S+) .*", copy)
    assert source, copy
    runs = "\n".join(s.runs() for s in _chain(source.group(1)))
    assert removes.search(runs) and runs.rfind("pip install") < removes.search(runs).start(), target
