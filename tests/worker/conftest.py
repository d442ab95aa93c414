"""Fixtures of the engine tests (tests/futures/rig.py)."""

from tests.worker.rig import make_rig, rig

__all__ = ["make_rig", "rig"]
