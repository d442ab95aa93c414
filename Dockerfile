# One image for every component of kafka-timers; the container's command picks the component:
#   timers-oscillator            the tick service
#   timers-worker                the futures worker (Faust; RocksDB under TIMERS_DATA_DIR)
#   timers topics create|check   topic setup (the Helm chart's pre-install Job)
#   timers schedule|cancel|watch the CLI
# The Spark jobs (timers-compact, timers-replay) need Java: build them with `--target jobs`.
#
#   docker build -t kafka-timers:0.1.0 .                      # services (the last stage)
#   docker build -t kafka-timers:0.1.0-jobs --target jobs .   # + Java 17 and the Spark extra
#
# Python dependencies are installed with -c constraints.txt, the same pins and hashes CI tests with.

# Bookworm, not the moving "slim" tag: openjdk-17-jre-headless (the jobs stage) is a bookworm package.
# Named by tag, not digest: the tag moves with bookworm's patch releases. To pin the build, pass
# --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:<digest> with the digest your registry
# shows for the tag you tested.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# The chart runs the containers as this user (podSecurityContext in helm/kafka-timers/values.yaml).
ARG APP_UID=10001

FROM ${PYTHON_IMAGE} AS base
ARG APP_UID
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/kafka-timers \
    PATH=/opt/kafka-timers/bin:$PATH \
    TIMERS_DATA_DIR=/var/lib/kafka-timers/data
RUN groupadd --system --gid "${APP_UID}" timers \
 && useradd --system --uid "${APP_UID}" --gid timers --home-dir /var/lib/kafka-timers \
        --no-create-home --shell /usr/sbin/nologin timers \
 && mkdir -p /var/lib/kafka-timers/data \
 && chown -R timers:timers /var/lib/kafka-timers

# Build our wheel, then install it and its pinned dependencies from wheels only: a dependency
# that would need a compiler should fail here, loudly. Our wheel holds compiled (Cython) modules,
# listed in setup.py: this stage alone has a C compiler, the images it feeds have none.
# Every file pip fetches is checked against the hashes in constraints.txt: pip first, by its own hash
# (the image's pip checks hashes in requirements files only, 26.1 and later in constraints files too),
# then the build backend into a venv of its own, then our wheel (no file to hash: built here) without
# its dependencies, then those, against constraints.txt.
FROM base AS build
WORKDIR /src
# Versions are not pinned: bookworm-security moves them, and an old pin would stop the build.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml setup.py constraints.txt requirements-pip.txt README.md ./
COPY ktimers ktimers
COPY oscillator oscillator
COPY futures futures
RUN python -m venv /opt/build \
 && /opt/build/bin/pip install --require-hashes --no-deps -r requirements-pip.txt \
 && /opt/build/bin/pip install --only-binary=:all: -c constraints.txt setuptools Cython \
 && /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels .
# The services' extra: Faust, RocksDB and Prometheus for the worker and the oscillator.
RUN python -m venv /opt/kafka-timers \
 && pip install --require-hashes --no-deps -r requirements-pip.txt \
 && pip install --no-deps "$(ls /wheels/kafka_timers-*.whl)" \
 && pip install --only-binary=:all: -c constraints.txt "kafka-timers[worker]"

# The Spark jobs' extra on top (pyspark is large, so the service image goes without it). pyspark is
# published as a source archive only; it is pure Python and builds without a compiler.
FROM build AS build-jobs
RUN pip install --only-binary=:all: --no-binary=pyspark -c constraints.txt "kafka-timers[jobs]" \
 && pip uninstall --yes pip setuptools

# The services' virtualenv, likewise without its installers.
FROM build AS build-service
RUN pip uninstall --yes pip setuptools

# What the images that run start from: the base image without pip, setuptools and ensurepip.
# Nothing installs packages at run time; the virtualenv's python is the one that runs.
FROM base AS runtime
RUN python3 -m pip uninstall --yes pip setuptools wheel \
 && rm -rf /usr/local/lib/python3.11/ensurepip

FROM runtime AS jobs
ARG APP_UID
# Debian's man pages are stripped from slim images; the JRE's postinst still expects the directory.
# Versions are not pinned: bookworm-security moves them, and an old pin would stop the build.
# hadolint ignore=DL3008
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build-jobs /opt/kafka-timers /opt/kafka-timers
# Spark's Python workers must run the interpreter that has the project installed.
ENV PYSPARK_PYTHON=/opt/kafka-timers/bin/python
WORKDIR /var/lib/kafka-timers
USER ${APP_UID}:${APP_UID}
CMD ["timers-compact", "--help"]

# Last stage, so a plain `docker build .` gives the services image.
FROM runtime AS service
ARG APP_UID
COPY --from=build-service /opt/kafka-timers /opt/kafka-timers
WORKDIR /var/lib/kafka-timers
USER ${APP_UID}:${APP_UID}
# 6066: worker /healthz /readyz, admin API (and /metrics); 6067: worker /metrics alone, as the
# chart sets it (TIMERS_METRICS_PORT); 8090: oscillator /healthz /metrics.
EXPOSE 6066 6067 8090
CMD ["timers", "--help"]
