"""Errors of the oscillator: it raises only the shared ones (unreachable brokers, missing topics)."""

from ktimers.errors import TimersError


class OscillatorError(TimersError):
    """Root of the errors only the oscillator raises."""
