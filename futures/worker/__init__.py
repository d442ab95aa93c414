"""The futures worker: a Faust app that stores timer requests and fires them on the oscillator's ticks.

A timer's path through the package: :mod:`transport` hands fetched request records to
:mod:`engine` (ingest: parse, latest wins, changelog), which keeps them in :mod:`table`
(RocksDB, bucketed by due time); a tick (:mod:`agents`) moves a partition's watermark, and the
engine sends what came due through :mod:`dispatch`, from records built by :mod:`callbacks`
(precise mode: :mod:`windows`). :mod:`wiring` builds it all, :mod:`main` runs it.
"""
