"""Fixtures of the engine tests (tests/worker/rig.py)."""

from tests.worker.rig import make_rig, rig

__all__ = ["make_rig", "rig"]
