"""Helpers for running the real daemon against the real broker inside a test."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from consumer.compose import build_processor
from consumer.config import Settings, settings_from_dict
from consumer.core.poll import TurnSnapshot
from consumer.kafka.processor import StreamProcessor
from consumer.service.observer import ProcessorObserver
from tests.conftest import KAFKA_LOCAL
from wire.input import encode_ipc_stream, message_headers, schema_fingerprint


def daemon_settings(bootstrap: str, input_topic: str, output_topic: str,
                    **sections: dict[str, Any]) -> Settings:
    data: dict[str, Any] = {
        "kafka": {"bootstrap_servers": bootstrap, "group_id": f"g-{uuid.uuid4().hex[:10]}"},
        "input": {"topics": [input_topic]},
        "output": {"topic": output_topic},
        "processing": {"instance_id": f"i-{uuid.uuid4().hex[:10]}",
                       "poll_timeout_ms": 100, "commit_interval_ms": 300},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return settings_from_dict(data)


class RunningDaemon:
    def __init__(self, processor: StreamProcessor, thread: threading.Thread) -> None:
        self.processor = processor
        self.thread = thread
        self.error: BaseException | None = None


@contextmanager
def running_daemon(settings: Settings,
                   observer: ProcessorObserver | None = None) -> Iterator[RunningDaemon]:
    """Run StreamProcessor in a thread; stop it and re-raise its error on exit."""
    processor = build_processor(settings, observer)
    daemon = RunningDaemon(processor, threading.Thread())

    def target() -> None:
        try:
            processor.run()
        except BaseException as err:  # noqa: BLE001 - handed to the test thread
            daemon.error = err

    daemon.thread = threading.Thread(target=target, name="arrowagg-daemon", daemon=True)
    daemon.thread.start()
    try:
        yield daemon
    finally:
        processor.request_stop()
        daemon.thread.join(60)
        assert not daemon.thread.is_alive(), "the daemon did not stop within 60s"
    if daemon.error is not None:
        raise daemon.error


def publish_tables(bootstrap: str, topic: str, tables: list[tuple[int, pa.Table]],
                   producer_id: str = "test") -> None:
    """Publish (partition, table) pairs as wire-format messages; fail on any delivery error."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 5})
    errors: list[object] = []
    for sequence, (partition, table) in enumerate(tables):
        headers = message_headers(fingerprint=schema_fingerprint(table.schema),
                                  producer_id=producer_id, sequence=sequence)
        producer.produce(topic, encode_ipc_stream(table, "zstd"), partition=partition,
                         headers=list(headers),
                         on_delivery=lambda err, _m: errors.append(err) if err else None)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert errors == []


def wait_for(condition: Callable[[], bool], *, timeout_s: float, what: str,
             seen: Callable[[], str] | None = None) -> None:
    """Poll ``condition`` until it holds; fail saying ``what`` (and what ``seen`` reports
    of the state at that moment) when ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    state = f"; {seen()}" if seen is not None else ""
    pytest.fail(f"timed out after {timeout_s}s waiting for {what}{state}")


def wait_all_committed(daemon: RunningDaemon, settings: Settings, *, rows: int,
                       timeout_s: float = 60) -> TurnSnapshot:
    """Wait until everything published is in committed output, and say so only then.

    Three conditions, each meaning what it says: the daemon has taken ``rows`` rows into
    its windows; at the end of a turn of its loop it holds no open window and no
    uncommitted output; and the broker holds the group's committed offsets at the end of
    every input partition (so every window of that input is in a committed transaction).
    """
    wait_for(lambda: daemon.processor.progress.counters.rows >= rows, timeout_s=timeout_s,
             what=f"{rows} rows taken into windows")
    wait_for(lambda: daemon.processor.progress.settled, timeout_s=timeout_s,
             what="no open window and no uncommitted output")
    topics = settings.input.topics
    bootstrap, group = settings.kafka.bootstrap_servers, settings.kafka.group_id
    wait_for(lambda: all(committed_offsets(bootstrap, group, t) == end_offsets(bootstrap, t)
                         for t in topics),
             timeout_s=timeout_s, what="the group's offsets committed at the input's end")
    return daemon.processor.progress


def _partitions(bootstrap: str, topic: str) -> list[int]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return sorted(admin.list_topics(topic, timeout=10).topics[topic].partitions)


def end_offsets(bootstrap: str, topic: str) -> list[int]:
    """The end (high watermark) of each partition of ``topic``."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"end-{uuid.uuid4().hex}"})
    try:
        return [reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in _partitions(bootstrap, topic)]
    finally:
        reader.close()


_COORDINATOR_MOVING = frozenset({
    KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError._TIMED_OUT, KafkaError._TRANSPORT})


def committed_offsets(bootstrap: str, group: str, topic: str) -> list[int]:
    """The group's committed offset in each partition of ``topic`` (-1: none), read
    without joining the group."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                       "enable.auto.commit": False})
    partitions = [TopicPartition(topic, p) for p in _partitions(bootstrap, topic)]
    try:
        return [tp.offset if tp.offset >= 0 else -1
                for tp in reader.committed(partitions, timeout=10)]
    except KafkaException as err:
        if not (err.args[0].retriable() or err.args[0].code() in _COORDINATOR_MOVING):
            raise
        # The group's coordinator is moving or loading (NOT_COORDINATOR, say): nothing
        # known to be committed yet, which a wait asks again about.
        return [-1] * len(partitions)
    finally:
        reader.close()


# -- the service side: an observed daemon, and a broker with a SCRAM listener -----------


@dataclass(frozen=True)
class ScramBroker:
    bootstrap: str        # PLAINTEXT: for the test's own admin, producer and reader
    sasl_bootstrap: str   # SASL_PLAINTEXT with SCRAM-SHA-256: for the daemon
    username: str
    password: str


@pytest.fixture(scope="session")
def scram_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScramBroker]:
    """A second local broker, in its own KAFKA_LOCAL_DIR (the session broker is left
    alone), with a SASL_PLAINTEXT listener and one SCRAM-SHA-256 user."""
    state = tmp_path_factory.mktemp("kafka-scram")
    env = {**os.environ, "KAFKA_LOCAL_DIR": str(state)}
    user, password = "arrowagg", f"pw-{uuid.uuid4().hex}"

    def kafka_local(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(KAFKA_LOCAL), *args], env=env,
                              capture_output=True, text=True, check=False, timeout=180)

    started = kafka_local("start", "--scram", f"{user}:{password}")
    if started.returncode != 0:
        kafka_local("stop")
        pytest.fail(f"scripts/kafka-local start --scram failed:\n{started.stderr}")
    sasl, plain = started.stdout.strip().splitlines()[-2:]
    try:
        yield ScramBroker(plain, sasl, user, password)
    finally:
        kafka_local("stop")
