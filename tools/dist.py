"""Build the sdist and the wheel of this checkout: ``python -m tools.dist DIR`` (``make dist``).

The build backend is the one installed in this interpreter by hash (``make venv``), setuptools
and Cython at the versions pyproject.toml's ``[build-system]`` names, called as an isolated
build would call it but without downloading them again. The wheel is built in the tree, so the
compiled modules already built in ``build/`` are reused while their sources are unchanged; the
rest of what an earlier build left there, and its list of the sdist's files, are removed first,
so that nothing the tree no longer holds (a module since deleted or renamed) is packed again.
"""

from __future__ import annotations

import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent


def check_build_tools() -> None:
    """Refuse to build with other versions of the build backend than pyproject.toml pins."""
    system = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]
    for line in system["requires"]:
        requirement = Requirement(line)
        try:
            installed = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            installed = None
        if installed is None or not requirement.specifier.contains(installed):
            raise SystemExit(
                f"the build needs {requirement}, this interpreter has {installed or 'none'}: run make venv"
            )


def prune_build_dir() -> None:
    """Keep, of what setuptools built before, only the compiled modules whose source is still here."""
    for lib in (REPO / "build").glob("lib.*"):
        for path in sorted(lib.rglob("*"), reverse=True):  # files before their folders
            source = REPO / path.relative_to(lib).parent / (path.name.split(".")[0] + ".pyx")
            if path.is_dir():
                if not any(path.iterdir()):
                    path.rmdir()
            elif not (path.suffix == ".so" and source.exists()):
                path.unlink()


def build(out: Path) -> tuple[Path, Path]:
    """The sdist and the wheel, written into ``out``."""
    check_build_tools()
    prune_build_dir()
    # setuptools adds to an sdist every file the last build's list names: only MANIFEST.in and
    # the tree decide it.
    (REPO / "kafka_timers.egg-info" / "SOURCES.txt").unlink(missing_ok=True)
    from setuptools import build_meta  # the backend pyproject.toml names

    out.mkdir(parents=True, exist_ok=True)
    sdist = build_meta.build_sdist(str(out))
    wheel = build_meta.build_wheel(str(out))
    return out / sdist, out / wheel


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tools.dist DIR", file=sys.stderr)
        return 2
    for path in build(Path(argv[0]).resolve()):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
