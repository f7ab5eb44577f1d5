"""The broker the broker-bound sections use, and the topics they fill.

``KAFKA_BOOTSTRAP_SERVERS`` when set; otherwise ``scripts/kafka-local`` in a state
directory of its own (``BENCH_KAFKA_DIR``, default under the system's temporary
directory, one per checkout), so the test suite's broker in ``.kafka-local`` is left
alone, and so is another checkout's bench. A broker the harness started, it stops.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

REPO = Path(__file__).resolve().parent.parent
KAFKA_LOCAL = REPO / "scripts" / "kafka-local"


class BrokerError(Exception):
    """The broker did not start or a topic could not be made; one line for the user."""


@contextmanager
def broker() -> Iterator[str]:
    """Yield a bootstrap address."""
    if bootstrap := os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield bootstrap
        return
    env = {**os.environ, "KAFKA_LOCAL_DIR": _state_dir()}
    started = _kafka_local("start", env)
    if started.returncode != 0:
        raise BrokerError(f"scripts/kafka-local start failed: {started.stderr.strip()[-500:]}")
    try:
        yield started.stdout.strip().splitlines()[-1]
    finally:
        _kafka_local("stop", env)


def _state_dir() -> str:
    """``BENCH_KAFKA_DIR``, else one directory per checkout: two worktrees' benches sharing
    one would each find the other's broker, and the first to finish would stop it under
    the other's feet."""
    checkout = hashlib.sha256(str(REPO).encode()).hexdigest()[:10]
    return os.environ.get("BENCH_KAFKA_DIR") or str(
        Path(tempfile.gettempdir()) / f"arrowagg-bench-kafka-{checkout}")


def _kafka_local(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(KAFKA_LOCAL), command], env=env,
                          capture_output=True, text=True, check=False, timeout=300)


def kafka_version(bootstrap: str) -> str:
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS") == bootstrap:
        return "external"
    done = _kafka_local("version", {**os.environ, "KAFKA_LOCAL_DIR": _state_dir()})
    return done.stdout.strip() or "unknown"


def create_topic(bootstrap: str, prefix: str, partitions: int,
                 config: dict[str, str] | None = None) -> str:
    """A new uuid-named topic; ``config``: topic-level settings."""
    name = f"bench-{prefix}-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})],
        operation_timeout=30)
    try:
        futures[name].result(timeout=60)
    except Exception as err:
        raise BrokerError(f"cannot create topic {name}: {err}") from err
    return name


def delete_topics(bootstrap: str, names: Sequence[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics(list(names), operation_timeout=30).values():
        try:
            future.result(timeout=60)
        except Exception:  # noqa: BLE001, S112 - cleanup is best effort
            continue


def fill(bootstrap: str, topic: str, values: Sequence[tuple[int, bytes]]) -> None:
    """Produce (partition, value) pairs in order; raise on any delivery error."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all",
                         "enable.idempotence": True, "compression.type": "none",
                         "queue.buffering.max.kbytes": 512 * 1024})
    errors: list[str] = []

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    try:
        for partition, value in values:
            while True:
                try:
                    producer.produce(topic, value, partition=partition, on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
    finally:
        left = producer.flush(120)
    if left or errors:
        raise BrokerError(f"filling {topic}: {left} undelivered, errors {errors[:3]}")
