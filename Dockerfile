# arrowagg daemon and tools. Not built on the project's CI machines (no Docker engine there);
# the entry points are the same `python -m consumer` / `python -m producer` the tests run.
FROM python:3.11-slim
RUN useradd --system --uid 10001 --home-dir /app arrowagg
WORKDIR /app
COPY pyproject.toml README.md ./
COPY consumer ./consumer
COPY producer ./producer
RUN pip install --no-cache-dir .
COPY config.yaml /etc/arrowagg/config.yaml
USER arrowagg
ENTRYPOINT ["python", "-m", "consumer"]
CMD ["run", "--config", "/etc/arrowagg/config.yaml"]
