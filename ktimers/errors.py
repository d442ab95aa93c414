"""Exception root shared by every kafka-timers package."""


class TimersError(Exception):
    """Root of every error raised by kafka-timers."""


class ConfigError(TimersError):
    """A setting is missing or invalid; the message names it and the fix."""


class TopicLayoutError(TimersError):
    """Topics are missing or not co-partitioned; the message says how to fix it."""


class DeliveryError(TimersError):
    """Kafka reported that a record could not be delivered."""
