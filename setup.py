"""The worker's compiled modules, built with the package (the rest is pyproject.toml).

Each reads the protobuf wire format where the worker does it once per timer
(docs/PERFORMANCE.md): ``futures.worker.prepare`` a stored timer into its callback,
``futures.worker.future_columns`` a request record's timers into columns. Installing from
source therefore needs a C compiler and Python's headers, as faust-streaming and aiokafka do
where no wheel fits.
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(
    ext_modules=cythonize(
        [
            Extension(f"futures.worker.{name}", [f"futures/worker/{name}.pyx"])
            for name in ("prepare", "future_columns")
        ],
        compiler_directives={"language_level": "3"},
    ),
)
