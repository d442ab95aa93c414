"""What the ``timers`` command needs beyond the client: reading the service's own records
(events, dead letters, requests) for people, asking the workers' admin API, and printing
tables. It imports the wire, the config and the client, never the worker (the command is
part of the client's install)."""
