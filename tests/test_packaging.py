"""What an application that installs kafka-timers gets: ranges it can upgrade within, whose lowest
versions the suite runs (tests/test_lowest_versions.py); and what the suite, the image and
`make venv` get: exact versions, each file checked against its hashes."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
#: The extras an application may install beside the client; the rest are the project's own tools.
LIBRARY_EXTRAS = ("guard", "oscillator", "registry")
#: The suite's lock (every extra), the client's lowest versions (build/lowest), and pip itself.
LOCKS = ("constraints.txt", "constraints-lowest.txt", "requirements-pip.txt")
_ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)((?:[ \t]*\\\n[ \t]+--hash=\S+)*)", re.MULTILINE)


def locked(name: str) -> dict[str, tuple[str, list[str]]]:
    """A lock file's entries: distribution → (version, hashes)."""
    text = (REPO / name).read_text()
    return {
        canonicalize_name(m.group(1)): (m.group(2), re.findall(r"--hash=(\S+)", m.group(3)))
        for m in _ENTRY.finditer(text)
    }


def _library_requirements() -> list[Requirement]:
    lines = [
        *PROJECT["dependencies"],
        *(r for e in LIBRARY_EXTRAS for r in PROJECT["optional-dependencies"][e]),
    ]
    return [Requirement(line) for line in lines]


def _floor(requirement: Requirement) -> str:
    lowest = [spec.version for spec in requirement.specifier if spec.operator == ">="]
    assert len(lowest) == 1, f"{requirement}: say the lowest version it works with"
    return lowest[0]


@pytest.mark.parametrize("requirement", _library_requirements(), ids=str)
def test_what_an_application_installs_is_a_range_from_a_tested_version(requirement: Requirement) -> None:
    specifier: SpecifierSet = requirement.specifier
    assert not any(spec.operator == "==" for spec in specifier), f"{requirement}: a range, not a pin"
    name = canonicalize_name(requirement.name)
    # The suite runs on constraints.txt, inside the range; build/lowest on the range's lowest version.
    pinned, _ = locked("constraints.txt")[name]
    assert specifier.contains(pinned), f"{requirement}: constraints.txt pins {pinned}"
    lowest, _ = locked("constraints-lowest.txt")[name]
    assert lowest == _floor(requirement), f"{requirement}: constraints-lowest.txt pins {lowest}"


@pytest.mark.parametrize("lock", LOCKS)
def test_every_locked_version_comes_with_the_hashes_of_its_files(lock: str) -> None:
    text = (REPO / lock).read_text()
    entries = locked(lock)
    # Every requirement line is an entry the pattern read: none escapes hash checking unread.
    lines = [line for line in text.splitlines() if re.match(r"[A-Za-z0-9]", line)]
    unread = [line for line in lines if canonicalize_name(re.split(r"[=\[ ;]", line)[0]) not in entries]
    assert len(lines) == len(entries) and not unread, unread
    for name, (_, hashes) in entries.items():
        assert hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), f"{lock}: {name}"


def test_the_suite_lock_holds_every_pin_of_pyproject() -> None:
    """What pyproject.toml pins exactly (tools, the worker's Faust) is the version the lock holds."""
    lock = locked("constraints.txt")
    requirements = [Requirement(r) for extra in PROJECT["optional-dependencies"].values() for r in extra]
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        if name == "kafka-timers":
            continue
        assert name in lock, f"constraints.txt locks no {name}: make constraints"
        assert requirement.specifier.contains(lock[name][0]), f"{requirement}: locked {lock[name][0]}"
