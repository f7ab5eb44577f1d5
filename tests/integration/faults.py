"""Helpers for the fault tests: a broker of the test's own that can be killed and brought
back on the same data and ports, a publisher that rides out broker outages, and the
checks every fault test makes (committed offsets, no hanging transaction, figures)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    IsolationLevel,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec
from confluent_kafka.cimpl import NewTopic

from tests.conftest import KAFKA_LOCAL
from wire.input import encode_ipc_stream, message_headers, schema_fingerprint

FIGURES = Path(__file__).resolve().parent / "figures"
STOP_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 90.0


def wait_until(condition: Any, *, timeout_s: float, what: str, interval_s: float = 0.3,
               ) -> float:
    """Poll ``condition()`` until it is true; return the seconds it took, or raise."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)
    return time.monotonic() - started


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"  # exited, waiting to be reaped by whoever is its parent


def broker_answers(bootstrap: str, timeout_s: float = 2.0) -> bool:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        admin.list_topics(timeout=timeout_s)
    except Exception:  # noqa: BLE001 - any failure means "not answering yet"
        return False
    return True


class LocalBroker:
    """A single-node broker of ``scripts/kafka-local`` in a state directory of its own.

    ``restart`` kills the broker process and relaunches its exact command line, so the
    restarted broker keeps its log directory, its cluster id and its ports.
    """

    def __init__(self, state_dir: Path, bootstrap: str) -> None:
        self.state_dir = state_dir
        self.bootstrap = bootstrap
        self._children: list[subprocess.Popen[bytes]] = []

    @classmethod
    def start(cls, state_dir: Path) -> LocalBroker:
        result = _kafka_local("start", state_dir)
        if result.returncode != 0:
            raise AssertionError(f"scripts/kafka-local start failed:\n{result.stderr[-4000:]}")
        return cls(state_dir, result.stdout.strip().splitlines()[-1])

    @property
    def pid(self) -> int:
        return int((self.state_dir / "kafka.pid").read_text().strip())

    def restart(self, stop_signal: signal.Signals, *, down_s: float) -> float:
        """Stop the broker with ``stop_signal``, keep it down ``down_s``, bring it back;
        return the seconds it did not answer."""
        pid = self.pid
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        went_down = time.monotonic()
        os.kill(pid, stop_signal)
        if not _wait_gone(pid, STOP_TIMEOUT_S):
            os.kill(pid, signal.SIGKILL)  # a clean stop that hangs is no test of ours
            _wait_gone(pid, 10)
        self._reap()
        time.sleep(down_s)
        with (self.state_dir / "logs" / "stdout.log").open("ab") as out:
            child = subprocess.Popen(argv, cwd=self.state_dir, stdout=out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        self._children.append(child)
        (self.state_dir / "kafka.pid").write_text(str(child.pid))
        wait_until(lambda: broker_answers(self.bootstrap), timeout_s=READY_TIMEOUT_S,
                   what="the restarted broker to list topics")
        return time.monotonic() - went_down

    def stop(self) -> None:
        _kafka_local("stop", self.state_dir)
        for child in self._children:
            if child.poll() is None:
                child.kill()
            child.wait(10)

    def log_tail(self, chars: int = 4000) -> str:
        return _kafka_local("logs", self.state_dir).stdout[-chars:]

    def _reap(self) -> None:
        for child in self._children:
            with suppress(subprocess.TimeoutExpired):
                child.wait(0)


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not _gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _kafka_local(command: str, state_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KAFKA_LOCAL_DIR": str(state_dir)}
    return subprocess.run([sys.executable, str(KAFKA_LOCAL), command], capture_output=True,
                          text=True, check=False, timeout=180, env=env)


@dataclass
class Delivery:
    partition: int
    offset: int
    timestamp_ms: int


@dataclass
class DurablePublisher:
    """Publishes wire-format batches exactly once, through broker outages.

    An idempotent producer with a long ``message.timeout.ms`` keeps retrying while the
    broker is down and never writes a batch twice; every batch must be delivered.
    """

    bootstrap: str
    topic: str
    producer_id: str = "durable"
    published: list[tuple[int, pa.Table]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    delivered: int = 0

    def __post_init__(self) -> None:
        self._producer = Producer({
            "bootstrap.servers": self.bootstrap, "enable.idempotence": True, "acks": "all",
            "message.timeout.ms": 240_000, "linger.ms": 5,
            "log_level": 0,  # connection errors during the outages are the point
        })
        self._lock = threading.Lock()

    def publish(self, partition: int, table: pa.Table) -> None:
        headers = message_headers(fingerprint=schema_fingerprint(table.schema),
                                  producer_id=self.producer_id, sequence=len(self.published))
        value = encode_ipc_stream(table, "zstd")
        while True:
            try:
                self._producer.produce(self.topic, value, partition=partition,
                                       headers=list(headers), on_delivery=self._delivered)
                break
            except BufferError:
                self._producer.poll(0.1)
        self._producer.poll(0)
        self.published.append((partition, table))

    def _delivered(self, err: KafkaError | None, _msg: Message) -> None:
        with self._lock:
            if err is None:
                self.delivered += 1
            else:
                self.errors.append(err.str())

    def flush(self, timeout_s: float = 120.0) -> None:
        remaining = self._producer.flush(timeout_s)
        assert remaining == 0, f"{remaining} batches still undelivered after {timeout_s}s"
        assert self.errors == [], f"delivery failed: {self.errors[:3]}"
        assert self.delivered == len(self.published)


class PacedPublishing:
    """A thread that publishes ``batches`` one after another, ``pause_s`` apart, until
    they run out or ``stop()`` is called."""

    def __init__(self, publisher: DurablePublisher, batches: Iterable[tuple[int, pa.Table]],
                 *, pause_s: float) -> None:
        self.publisher = publisher
        self._batches = iter(batches)
        self._pause_s = pause_s
        self._stop = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="paced-publisher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for partition, table in self._batches:
                if self._stop.is_set():
                    return
                self.publisher.publish(partition, table)
                time.sleep(self._pause_s)
        except BaseException as err:  # noqa: BLE001 - handed to the test thread
            self._failure = err

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        if self._failure is not None:
            raise self._failure

    def finish(self, timeout_s: float = 120.0) -> None:
        """Wait until every batch is published."""
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), f"still publishing after {timeout_s}s"
        if self._failure is not None:
            raise self._failure


def create_topics(admin: AdminClient, partitions: dict[str, int]) -> None:
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=count, replication_factor=1)
         for name, count in partitions.items()], operation_timeout=30)
    for future in futures.values():
        future.result(timeout=30)


def group_committed(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    """The group's committed offset per partition (-1 where nothing is committed);
    read without joining the group."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "log_level": 0})
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in range(partitions)],
                                       timeout=10)
        return [tp.offset if tp.offset >= 0 else -1 for tp in committed]
    except Exception:  # noqa: BLE001 - the broker may be down or still loading the group
        return [-1] * partitions
    finally:
        consumer.close()


def end_offsets(admin: AdminClient, topic: str, partitions: int, *,
                isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED) -> list[int]:
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call] # untyped in the stubs
    request = {TopicPartition(topic, p): latest for p in range(partitions)}
    futures = admin.list_offsets(request, isolation_level=isolation, request_timeout=10)
    by_partition = {tp.partition: future.result().offset for tp, future in futures.items()}
    return [by_partition[p] for p in range(partitions)]


def hanging_transactions(admin: AdminClient, topic: str, partitions: int) -> dict[int, int]:
    """Partitions whose last stable offset is below the high watermark, with the gap:
    an open (hanging) transaction holds the LSO back. ``{}`` when there is none."""
    stable = end_offsets(admin, topic, partitions, isolation=IsolationLevel.READ_COMMITTED)
    high = end_offsets(admin, topic, partitions)
    return {p: h - s for p, (s, h) in enumerate(zip(stable, high, strict=True)) if s != h}


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    value: bytes
    headers: dict[str, bytes]


def read_topic(bootstrap: str, topic: str, partitions: int, *, quiet_s: float = 3.0,
               timeout_s: float = 60.0) -> list[Record]:
    """Every committed record of ``topic`` (read_committed), from the beginning until it
    has been quiet for ``quiet_s``."""
    return list(_records(bootstrap, topic, partitions, quiet_s=quiet_s, timeout_s=timeout_s))


def _records(bootstrap: str, topic: str, partitions: int, *, quiet_s: float,
             timeout_s: float) -> Iterator[Record]:
    """Until every partition has reached its end (its last stable offset) and nothing
    came for ``quiet_s``. Quiet alone is not enough: on a busy machine a new consumer's
    first fetch can take longer than ``quiet_s``, and a reader stopping on quiet alone
    saw none of the records there (a soak run's waits timed out so, every record in)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{topic}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    deadline = time.monotonic() + timeout_s
    quiet_since = time.monotonic()
    at_end: set[int] = set()
    try:
        while (len(at_end) < partitions or time.monotonic() - quiet_since < quiet_s) \
                and time.monotonic() < deadline:
            for message in consumer.consume(500, 0.5):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        at_end.add(message.partition() or 0)
                    continue
                at_end.discard(message.partition() or 0)
                quiet_since = time.monotonic()
                raw = message.headers()
                pairs = raw.items() if isinstance(raw, dict) else raw or []
                yield Record(message.partition() or 0, message.offset() or 0,
                             message.value() or b"",
                             {k: v for k, v in pairs if isinstance(v, bytes)})
    finally:
        consumer.close()


def keyed_by_partition(data: list[tuple[int, pa.Table]]) -> list[tuple[int, pa.Table]]:
    """Each partition's rows carry only its own site ("site-<p>"), so no group is split
    between instances and their outputs merge to the reference."""
    out = []
    for partition, table in data:
        sites = pa.array([f"site-{partition}"] * table.num_rows)
        out.append((partition, table.set_column(table.schema.get_field_index("site"), "site",
                                                sites)))
    return out


def late_rows_logged(*logs: Path) -> int:
    """Late rows a daemon without a late topic reported in its log."""
    return sum(int(n) for log in logs if log.exists()
               for n in re.findall(r"(\d+) late rows", log.read_text()))


def repeated_groups(frame: pl.DataFrame, keys: list[str]) -> int:
    """How many (window_start, keys) groups occur in more than one output row."""
    counts = frame.group_by(["window_start", *keys]).len()
    return counts.filter(pl.col("len") > 1).height


def write_figures(name: str, figures: dict[str, Any]) -> None:
    """Print the figures and keep them in figures/<name>.json for docs/reliability.md."""
    FIGURES.mkdir(exist_ok=True)
    text = json.dumps(figures, indent=2, sort_keys=True, default=str)
    (FIGURES / f"{name}.json").write_text(text + "\n")
    print(f"{name}: {text}")
