"""A deterministic simulation of the worker's world, driving the production engine.

FoundationDB and TigerBeetle (VOPR) test their real code against a simulated world with a
reference model and a seed that reproduces any failure; Jepsen checks the history a run left.
Here the world is Kafka's log: the real :class:`~futures.worker.engine.TimerEngine` on real
RocksDB tables (:class:`~futures.worker.table.PartitionTimers` under a temp dir), driven through
the calls the transport and the store make, against a pure-Python Kafka
(:mod:`tests.simulation.kafka`) that compacts, expires tombstones, writes transaction markers,
rebalances between workers that may crash, come back on an empty or an old data dir, or keep
writing after their partitions went elsewhere. Ticks come duplicated, reordered, late or bogus;
clocks are skewed within the tolerance. Time is simulated (:mod:`tests.simulation.loop`).

Modules: :mod:`~tests.simulation.loop` (virtual time), :mod:`~tests.simulation.kafka` (the
log), :mod:`~tests.simulation.producer` (librdkafka's producer, into the log),
:mod:`~tests.simulation.worker` (one worker process), :mod:`~tests.simulation.faults` (what may
go wrong, and the known holes), :mod:`~tests.simulation.schedule` (the steps a seed draws),
:mod:`~tests.simulation.world` (runs a schedule), :mod:`~tests.simulation.model` and
:mod:`~tests.simulation.checker` (what should have happened, and the invariants),
:mod:`~tests.simulation.shrink` (the shortest schedule that still fails). ``python -m
tests.simulation`` runs it for as long as asked (``make simulate``); docs/simulation.md.
"""
