"""The worker's one compiled module, built with the package (the rest is pyproject.toml).

``futures.worker.prepare`` reads a stored timer's bytes into its callback: it runs once per
fired timer, and in the interpreter it was a third of what firing cost the engine
(docs/PERFORMANCE.md). Installing from source therefore needs a C compiler and Python's
headers, as faust-streaming and aiokafka do where no wheel fits.
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(
    ext_modules=cythonize(
        [Extension("futures.worker.prepare", ["futures/worker/prepare.pyx"])],
        compiler_directives={"language_level": "3"},
    ),
)
