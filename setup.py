"""The worker's compiled modules, built with the package (the rest is pyproject.toml).

Each does what the worker or the client does once per timer (docs/PERFORMANCE.md):
``futures.worker.prepare`` reads a stored timer into its callback,
``futures.worker.future_columns`` a request record's timers into columns,
``futures.worker.staging`` stages them into an ingest step,
``futures.worker.fired_keys`` packs and unpacks the keys an ``f`` record lists,
``futures.worker.table_read`` takes a read's due timers off RocksDB's iterator,
``futures.worker.table_write`` turns changelog records into a table's write batch,
``futures.worker.built_ahead`` holds the callbacks built ahead of their tick,
``futures.worker.callback_queue`` queues callback records into librdkafka,
and ``futures.worker.fired_columns`` turns a piece of fired timers into what is recorded of it.
Building the package therefore needs a C compiler and Python's headers; the client is pure
Python, but it ships in the same wheel, which is built for one Python version and platform.
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(
    ext_modules=cythonize(
        [
            Extension(f"futures.worker.{name}", [f"futures/worker/{name}.pyx"])
            for name in (
                "prepare",
                "future_columns",
                "staging",
                "fired_keys",
                "table_write",
                "callback_queue",
                "fired_columns",
                "table_read",
                "built_ahead",
            )
        ],
        compiler_directives={"language_level": "3"},
    ),
)
