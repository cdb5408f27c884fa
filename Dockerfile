# Narwhal images. Two targets over one base:
#   router (default): narwhal-serve, narwhal-supervisor, narwhal-engine-sim — the runtime
#                     dependencies plus the [otel] extra (OTLP export); no Temporal packages.
#   worker:           narwhal-worker, narwhal-restart — adds the Temporal client ([worker] extra).
# Build: docker build -t narwhal:latest .   docker build --target worker -t narwhal-worker:latest .
# Deployment: docker-compose.yml, docs/deployment.md
FROM python:3.11-slim AS base

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/narwhal
COPY pyproject.toml setup.py README.md ./
COPY router ./router
COPY workflows ./workflows
COPY activities ./activities
COPY narwhal_models ./narwhal_models
COPY fleet ./fleet

RUN groupadd --system --gid 10001 narwhal \
 && useradd --system --uid 10001 --gid narwhal --home-dir /var/lib/narwhal --shell /usr/sbin/nologin narwhal \
 && mkdir -p /config /shared /var/lib/narwhal \
 && chown narwhal:narwhal /shared /var/lib/narwhal

# /config: fleet and supervisor files (mounted read-only); /shared: the lease domain both routers
# must see (one filesystem with flock); /var/lib/narwhal: handoff state file and request journal.
VOLUME ["/shared", "/var/lib/narwhal"]
WORKDIR /var/lib/narwhal
CMD ["narwhal-serve", "--help"]

FROM base AS worker
RUN pip install '/opt/narwhal[worker,otel]'
USER narwhal

# The router's relay loop is a small C extension (router/serving/_relay.c): a compiler for the
# install only, removed after it (without one the install still works, on the slower Python loop).
FROM base AS router
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && pip install '/opt/narwhal[otel]' \
 && apt-get purge -y --auto-remove gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
USER narwhal
# 8000 router (clients + /narwhal control API), 8900 local supervisor, 9001-9004 simulated engines
EXPOSE 8000 8900 9001 9002 9003 9004
