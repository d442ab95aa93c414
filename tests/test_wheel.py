"""The wheel ``make dist`` builds, installed where there is no build tool and no checkout.

Built by ``tools.dist`` (what ``make dist`` runs) into build/wheel/dist, installed into
build/wheel/venv as the Dockerfile installs it: pip by its hash, the wheel without its
dependencies, then those from wheels only, each file checked against constraints.txt. The
virtualenv has no setuptools and no Cython, and nothing is compiled: a dependency without a
wheel fails the install. Its dependencies stay while constraints.txt, requirements-pip.txt
and pyproject.toml are unchanged; the wheel is installed afresh on every run. The jobs extra
(PySpark, hundreds of MB) is left out: its scripts must then say which extra they need.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

from ktimers.config import CommonConfig
from ktimers.wire import Future
from tests.docs.blocks import blocks
from tests.integration.test_client_integration import consume

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent
BUILD = REPO / "build" / "wheel"
VENV = BUILD / "venv"
PYTHON = VENV / "bin" / "python"
#: What the venv's dependencies were installed from: a change to any of them installs them anew.
INPUTS = ("constraints.txt", "requirements-pip.txt", "pyproject.toml")
EXTRAS = ("worker", "guard")
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
#: The scripts of the extra not installed, and that extra.
NOT_INSTALLED = {"timers-compact": "jobs", "timers-replay": "jobs", "timers-report": "jobs"}


def _run(
    command: list[str | Path],
    *,
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = 240,
    ok: bool = True,
) -> subprocess.CompletedProcess[str]:
    """``command``'s output; with ``ok``, once it exited 0."""
    args = [str(part) for part in command]
    result = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0 or not ok, f"{' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without what would let the venv see the checkout or the suite's venv."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PYTEST_"))}
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}


@pytest.fixture(scope="module")
def dist() -> tuple[Path, Path]:
    """The sdist and the wheel, built afresh (the compiled modules in build/ are reused)."""
    out = BUILD / "dist"
    shutil.rmtree(out, ignore_errors=True)
    _run([sys.executable, "-m", "tools.dist", out], cwd=REPO)
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return sdist, wheel


@pytest.fixture(scope="module")
def python(dist: tuple[Path, Path]) -> Path:
    """The venv's interpreter, the wheel and its dependencies installed."""
    _, wheel = dist
    digest = hashlib.sha256(b"".join((REPO / name).read_bytes() for name in INPUTS)).hexdigest()
    stamp = VENV / ".inputs"
    pip = [PYTHON, "-m", "pip", "--quiet", "--disable-pip-version-check"]
    if not (PYTHON.exists() and stamp.exists() and stamp.read_text() == digest):
        venv.EnvBuilder(clear=True, with_pip=True).create(VENV)
        _run(
            [*pip, "install", "--require-hashes", "--no-deps", "-r", REPO / "requirements-pip.txt"], cwd=BUILD
        )
        _run([*pip, "uninstall", "--yes", "setuptools"], cwd=BUILD)  # ensurepip's: no build backend here
    else:
        stamp.unlink()
    _run([*pip, "install", "--force-reinstall", "--no-deps", wheel], cwd=BUILD)
    extras = ",".join(EXTRAS)
    constraints = REPO / "constraints.txt"
    _run([*pip, "install", "--only-binary=:all:", "-c", constraints, f"kafka-timers[{extras}]"], cwd=BUILD)
    stamp.write_text(digest)
    return PYTHON


def test_the_wheel_holds_the_compiled_worker_and_a_pure_python_client(dist: tuple[Path, Path]) -> None:
    _, wheel = dist
    names = zipfile.ZipFile(wheel).namelist()
    compiled = {name for name in names if name.endswith(".so")}
    sources = {p.relative_to(REPO).with_suffix("") for p in (REPO / "futures" / "worker").glob("*.pyx")}
    assert {Path(name.split(".")[0]) for name in compiled} == sources
    assert not [name for name in names if name.startswith("futures/client/") and not name.endswith(".py")]
    # What the build reads stays out of what is installed.
    assert not [name for name in names if name.endswith((".c", ".pyx", ".pxd"))]
    assert "futures/worker/admin/static/index.html" in names


def test_the_sdist_holds_what_the_wheel_is_built_from(dist: tuple[Path, Path]) -> None:
    sdist, _ = dist
    with tarfile.open(sdist) as archive:
        names = {name.partition("/")[2] for name in archive.getnames()}
    tracked = _run(["git", "ls-files", "futures", "ktimers", "oscillator"], cwd=REPO).stdout.split()
    built_from = {"pyproject.toml", "setup.py", "README.md", "LICENSE", *tracked}
    assert not built_from - names, sorted(built_from - names)


def test_the_readme_installs_the_wheel_make_dist_builds(dist: tuple[Path, Path]) -> None:
    """kafka-timers is on no package index: the README's install commands take the wheel from dist/,
    and name the project only once it is installed from there (to add its dependencies)."""
    _, wheel = dist
    readme = REPO / "README.md"
    text = readme.read_text()
    section = text[text.index("## Install\n") : text.index("\n## ", text.index("## Install\n") + 1)]
    commands = [
        line.split("#")[0].strip()
        for block in blocks(section, readme)
        if block.language == "bash"
        for line in block.code.splitlines()
    ]
    assert "make dist" in commands
    installs = [command for command in commands if command.startswith("pip install")]
    wheels = [re.search(r"dist/kafka_timers-\S*?\.whl", command) for command in installs]
    assert any(wheels)
    for command, found in zip(installs, wheels, strict=True):
        if found:
            assert fnmatch.fnmatch(f"dist/{wheel.name}", found.group(0)), command
        elif re.search(r"\bkafka-timers\b", command):
            assert any(wheels[: installs.index(command)]), f"{command}: before the wheel is installed"


def test_nothing_in_the_venv_could_compile_or_import_the_checkout(python: Path, tmp_path: Path) -> None:
    code = (
        "import importlib.util, futures, sys; "
        "print(futures.__file__); "
        "print([m for m in ('setuptools', 'Cython') if importlib.util.find_spec(m)])"
    )
    out = _run([python, "-c", code], cwd=tmp_path, env=_clean_env()).stdout.splitlines()
    assert out[0].startswith(str(VENV)), out[0]
    assert out[1] == "[]"


def test_the_installed_client_schedules_a_timer(
    python: Path, tmp_path: Path, timers_env: dict[str, str]
) -> None:
    code = """if True:
        from futures.client import TimerClient

        with TimerClient() as client:
            handle = client.schedule("wheel-callbacks", "k-1", b"from the wheel", delay=3600)
        print(handle.id)
    """
    timer_id = _run([python, "-c", code], cwd=tmp_path, env=_clean_env(**timers_env)).stdout.strip()

    common = CommonConfig.from_env(timers_env)
    (record,) = consume(common, common.topics.request, expected=1)
    future = Future.FromString(record.value() or b"")
    assert record.key() == timer_id.encode()
    assert (future.callBackTopic, future.callBackKey, future.callBack) == (
        "wheel-callbacks",
        "k-1",
        b"from the wheel",
    )
    assert future.id == timer_id


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_console_script_answers_help(python: Path, tmp_path: Path, script: str) -> None:
    command = [VENV / "bin" / script, "--help"]
    if script in NOT_INSTALLED:
        result = _run(command, timeout=60, cwd=tmp_path, env=_clean_env(), ok=False)
        assert result.returncode == 2, result.stderr
        assert f"kafka-timers[{NOT_INSTALLED[script]}]" in result.stderr, result.stderr
        return
    result = _run(command, timeout=60, cwd=tmp_path, env=_clean_env())
    assert "usage:" in result.stdout.lower(), result.stdout
