"""Exception root shared by every kafka-timers package."""


class TimersError(Exception):
    """Root of every error raised by kafka-timers."""


class ConfigError(TimersError):
    """A setting is missing or invalid; the message names it and the fix."""


class TopicLayoutError(TimersError):
    """Topics are missing or not co-partitioned; the message says how to fix it."""


class MissingTopicError(TopicLayoutError):
    """A topic the service needs does not exist (yet); the message names the command that creates it."""


class BrokersUnreachableError(TimersError):
    """The brokers did not answer in time; the message says what to check."""


class DeliveryError(TimersError):
    """Kafka reported that a record could not be delivered."""
