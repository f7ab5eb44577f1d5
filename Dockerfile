# arrowagg daemon and tools. `docker compose up` builds it (docker-compose.yml); `make
# compose-test` builds and runs the whole stack (tests/compose/). The entry points are the
# same `python -m consumer` / `python -m producer` the tests run.
#
# BASE_IMAGE: python:3.11-slim by default; scripts/docker-local builds a stand-in from
# Debian's packages where no image registry answers. A CA bundle for builds whose outbound
# TLS is re-signed by a local CA (corporate proxies) comes in as the build secret
# `ca_bundle` (`docker build --secret id=ca_bundle,src=/etc/ssl/certs/ca-certificates.crt`):
# pip reads it during the install, and no layer keeps it.
ARG BASE_IMAGE=python:3.11-slim

# The tools (workers, topic creation, tail): the daemon's image without its HEALTHCHECK,
# so `docker compose up --wait` waits for them to run rather than for a health they lack.
FROM ${BASE_IMAGE} AS tools
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
RUN useradd --system --uid 10001 --home-dir /app arrowagg \
    && mkdir /run/arrowagg-slots && chown arrowagg /run/arrowagg-slots
WORKDIR /app
# The dependencies first, in a layer that only pyproject.toml invalidates; then the
# project itself, without them (a change to the sources reinstalls in seconds). pip's
# cache is a build cache mount: kept by the builder between builds, in no layer.
COPY pyproject.toml ./
RUN --mount=type=secret,id=ca_bundle --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
    && python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'], sep='\n')" > /tmp/dependencies.txt \
    && pip install -r /tmp/dependencies.txt && rm /tmp/dependencies.txt
COPY README.md ./
COPY wire ./wire
COPY consumer ./consumer
COPY producer ./producer
RUN --mount=type=secret,id=ca_bundle --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
    && pip install --no-deps .
COPY config.yaml /etc/arrowagg/config.yaml
COPY deploy/arrowagg-slot /usr/local/bin/arrowagg-slot
USER arrowagg
# /metrics, /healthz, /readyz (service.http_port); set ARROWAGG_SERVICE__HTTP_HOST=0.0.0.0
# to reach them from outside the container.
EXPOSE 9464
# SIGTERM: finish the batch in flight, commit, leave the group.
STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m", "consumer"]
CMD ["run", "--config", "/etc/arrowagg/config.yaml"]

# The daemon (the default target).
FROM tools AS daemon
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-m", "consumer.healthcheck"]
