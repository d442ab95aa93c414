"""kafka-timers: the futures worker (Faust), the client library and the batch jobs.

Deliberately empty: `futures.client` and `futures.client.guard` must import without Faust.
"""
