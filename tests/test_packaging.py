"""What an application that installs kafka-timers gets: ranges it can upgrade within, whose lowest
versions are the ones this suite runs on."""

from __future__ import annotations

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


def _pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name.split("[")[0])] = version
    return pins


def _library_requirements() -> list[Requirement]:
    lines = [
        *PROJECT["dependencies"],
        *(r for e in LIBRARY_EXTRAS for r in PROJECT["optional-dependencies"][e]),
    ]
    return [Requirement(line) for line in lines]


@pytest.mark.parametrize("requirement", _library_requirements(), ids=str)
def test_what_an_application_installs_is_a_range_from_the_tested_version(requirement: Requirement) -> None:
    specifier: SpecifierSet = requirement.specifier
    assert not any(spec.operator == "==" for spec in specifier), f"{requirement}: a range, not a pin"
    lowest = [spec.version for spec in specifier if spec.operator == ">="]
    assert lowest, f"{requirement}: say the lowest version it works with"
    pinned = _pins()[canonicalize_name(requirement.name)]
    # The suite runs on constraints.txt: its pin is the lowest version the range admits.
    assert lowest == [pinned], f"{requirement}: constraints.txt pins {pinned}"
    assert specifier.contains(pinned)
