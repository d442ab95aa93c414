"""The ``timers`` command, one module per command (``schedule``, ``cancel``, ``watch``, ``topics``,
``broker``; ``commands``: ``list``, ``show``, ``status``, ``deadletter resend``), and what they
share: reaching Kafka (:mod:`~futures.console.connect`), reading the service's own records
(events, dead letters, requests) for people, asking the workers' admin API, and printing tables.
:mod:`futures.cli` builds the parser from them. It imports the wire, the config and the client,
never the worker (the command is part of the client's install)."""
