# arrowagg daemon and tools. Not built on the project's CI machines (no Docker engine there);
# the entry points are the same `python -m consumer` / `python -m producer` the tests run,
# and the HEALTHCHECK is `python -m consumer.healthcheck`, which the tests run too.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
RUN useradd --system --uid 10001 --home-dir /app arrowagg
WORKDIR /app
COPY pyproject.toml README.md ./
COPY wire ./wire
COPY consumer ./consumer
COPY producer ./producer
RUN pip install --no-cache-dir .
COPY config.yaml /etc/arrowagg/config.yaml
USER arrowagg
# /metrics, /healthz, /readyz (service.http_port); set ARROWAGG_SERVICE__HTTP_HOST=0.0.0.0
# to reach them from outside the container.
EXPOSE 9464
# SIGTERM: finish the batch in flight, commit, leave the group.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-m", "consumer.healthcheck"]
ENTRYPOINT ["python", "-m", "consumer"]
CMD ["run", "--config", "/etc/arrowagg/config.yaml"]
