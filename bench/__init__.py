"""``make bench``: kafka-timers measured side by side with its ceiling and the Redis design.

One run, one broker, one machine: a plain confluent-kafka pass-through (the ceiling no
timer service on this broker can beat), a bare Faust agent (the framework's floor),
the service itself (ingest, fire, lateness, capacity, precise mode) and the Redis
sorted-set design a user would pick instead. ``python -m bench --help``.
"""
