"""Transactions under faults, through Apache Kafka: a crash between produce and commit
leaves nothing visible to read_committed readers and no hanging transaction; a zombie
instance is fenced and exits non-zero; a stalled instance cannot commit a duplicate."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from confluent_kafka import Consumer, IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec
from polars.testing import assert_frame_equal

from consumer.kafka_clients import producer_config
from consumer.processor import StreamProcessor
from consumer.sink import OutputRecord, TransactionalSink
from tests.conftest import TopicFactory
from tests.integration.conftest import daemon_settings, publish_tables, running_daemon, wait_for
from tests.integration.test_pipeline import KEYS, make_input, output_frame, reference
from tests.integration.test_recovery import SIZE_MS, start_daemon, write_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]


class ProcessDiedError(BaseException):
    """Stands for the process dying: nothing after it runs, not even an abort."""


class DiesBeforeCommit(TransactionalSink):
    """Produces the first transaction that holds windows, then dies before committing it."""

    def __init__(self, config: dict[str, object], output_topic: str) -> None:
        super().__init__(config)
        self._output_topic = output_topic
        self.died = threading.Event()

    def flush(self, records: Sequence[OutputRecord], offsets: Sequence[TopicPartition],
              consumer: Consumer) -> None:
        if self.died.is_set() or not any(r.topic == self._output_topic for r in records):
            super().flush(records, offsets, consumer)
            return
        producer = self._producer
        producer.begin_transaction()
        for record in records:
            producer.produce(record.topic, record.value, record.key, headers=list(record.headers))
        producer.flush(10)  # the records reach the broker; the commit never does
        self.died.set()
        raise ProcessDiedError

    def close(self) -> None:
        pass  # a dead process closes nothing


def count_visible(bootstrap: str, topic: str, isolation: str) -> int:
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"v-{uuid.uuid4().hex}",
                       "auto.offset.reset": "earliest", "isolation.level": isolation})
    reader.subscribe([topic])
    seen = 0
    try:
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            message = reader.poll(0.2)
            if message is not None and message.error() is None:
                seen += 1
    finally:
        reader.close()
    return seen


def stable_equals_high_watermark(admin: AdminClient, topic: str, partitions: int) -> bool:
    """No hanging transaction: per partition, the last stable offset is the high watermark."""
    def latest(isolation: IsolationLevel) -> list[int]:
        request = {TopicPartition(topic, p): OffsetSpec.latest()  # type: ignore[no-untyped-call]
                   for p in range(partitions)}
        futures = admin.list_offsets(request, isolation_level=isolation)
        return [futures[tp].result(30).offset for tp in sorted(futures, key=lambda t: t.partition)]
    return latest(IsolationLevel.READ_COMMITTED) == latest(IsolationLevel.READ_UNCOMMITTED)


def test_crash_between_produce_and_commit_is_invisible_and_leaves_no_hanging_transaction(
    bootstrap: str, topic_factory: TopicFactory, admin: AdminClient
) -> None:
    source, sink = topic_factory("in", partitions=2), topic_factory("out")
    settings = daemon_settings(bootstrap, source, sink, window={
        "kind": "tumbling", "time": "event", "timestamp_column": "ts", "size_ms": SIZE_MS,
        "idle_timeout_ms": 1500})
    data = make_input(batches_per_producer=40, producers=2, span_ms=30)
    publish_tables(bootstrap, source, data)

    dying = DiesBeforeCommit(producer_config(settings.kafka, settings.processing), sink)
    first = StreamProcessor(settings, sink=dying)
    def run_until_it_dies() -> None:
        with pytest.raises(ProcessDiedError):
            first.run()

    thread = threading.Thread(target=run_until_it_dies, daemon=True)
    thread.start()
    thread.join(60)
    assert dying.died.is_set()
    pending = count_visible(bootstrap, sink, "read_uncommitted")
    hidden = count_visible(bootstrap, sink, "read_committed")
    print(f"crash before commit: read_uncommitted sees {pending} pending records, "
          f"read_committed {hidden}")
    assert pending > 0
    assert hidden == 0

    # The restarted instance (same transactional.id) fences the dead one's transaction.
    with running_daemon(settings) as daemon:
        rows = sum(t.num_rows for _, t in data)
        wait_for(lambda: daemon.processor.counters.rows == rows, timeout_s=60, what="replay")
        wait_for(lambda: daemon.processor.open_windows() == 0, timeout_s=30,
                 what="every window closed")
    got, starts = output_frame(bootstrap, sink)
    assert sorted(starts) == sorted(set(starts)), "a window was committed twice"
    assert_frame_equal(got.drop("window_end").sort(["window_start", *KEYS]),
                       reference([t for _, t in data], SIZE_MS), check_exact=False,
                       rel_tol=1e-9, abs_tol=1e-9, check_dtypes=False)
    assert stable_equals_high_watermark(admin, sink, partitions=1)
    del dying  # the zombie producer goes only now, after the checks


def keyed_by_partition(data: list[tuple[int, pa.Table]]) -> list[tuple[int, pa.Table]]:
    """Each site lives in one partition, so instances' outputs merge to the reference."""
    out = []
    for partition, table in data:
        sites = pa.array([f"site-{partition}"] * table.num_rows)
        out.append((partition, table.set_column(table.schema.get_field_index("site"), "site",
                                                sites)))
    return out


def merged_rows(bootstrap: str, sink: str) -> pl.DataFrame:
    got, _ = output_frame(bootstrap, sink)
    return got.drop("window_end").sort(["window_start", *KEYS])


def test_zombie_with_the_same_transactional_id_is_fenced_and_exits_non_zero(
    bootstrap: str, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    source, sink = topic_factory("in", partitions=2), topic_factory("out")
    config = write_config(tmp_path / "config.yaml", bootstrap, source, sink, f"g-{source}",
                          instance_id="same-instance")
    data = keyed_by_partition(make_input(batches_per_producer=40, producers=2, span_ms=30))
    half = len(data) // 2
    zombie = start_daemon(config, tmp_path / "zombie.log")
    successor = None
    try:
        publish_tables(bootstrap, source, data[:half], producer_id="w1")
        time.sleep(4)
        successor = start_daemon(config, tmp_path / "successor.log")
        code = zombie.wait(60)
        zombie_log = (tmp_path / "zombie.log").read_text()
        print(f"zombie: exit code {code}; last line: {zombie_log.strip().splitlines()[-1]}")
        assert code != 0
        assert "fatal" in zombie_log.lower()
        assert "fenced" in zombie_log.lower()
        publish_tables(bootstrap, source, data[half:], producer_id="w2")
        time.sleep(6)
        successor.send_signal(signal.SIGTERM)
        assert successor.wait(30) == 0
    finally:
        for process in (zombie, successor):
            if process is not None and process.poll() is None:
                process.kill()
    got = merged_rows(bootstrap, sink)
    assert got.select(["window_start", *KEYS]).is_duplicated().sum() == 0
    assert_frame_equal(got, reference([t for _, t in data], SIZE_MS), check_exact=False,
                       rel_tol=1e-9, abs_tol=1e-9, check_dtypes=False)


def test_a_stalled_instance_cannot_commit_a_duplicate_window(
    bootstrap: str, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    source, sink = topic_factory("in", partitions=2), topic_factory("out")
    group = f"g-{source}"
    timeouts = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000,
                "max.poll.interval.ms": 8000}
    configs = [write_config(tmp_path / f"{name}.yaml", bootstrap, source, sink, group,
                            instance_id=name, consumer=timeouts) for name in ("a", "b")]
    data = keyed_by_partition(make_input(batches_per_producer=50, producers=2, span_ms=30))
    third = len(data) // 3
    stalled = start_daemon(configs[0], tmp_path / "a.log")
    other: subprocess.Popen[bytes] | None = None
    try:
        publish_tables(bootstrap, source, data[:third], producer_id="w1")
        time.sleep(3)
        other = start_daemon(configs[1], tmp_path / "b.log")
        time.sleep(4)  # b joins: the partitions are shared
        publish_tables(bootstrap, source, data[third:2 * third], producer_id="w2")
        time.sleep(0.5)
        stalled.send_signal(signal.SIGSTOP)  # stalled mid-stream, maybe mid-transaction
        time.sleep(12)  # past session.timeout.ms and max.poll.interval.ms: b takes over
        publish_tables(bootstrap, source, data[2 * third:], producer_id="w3")
        stalled.send_signal(signal.SIGCONT)  # the zombie wakes up and tries to go on
        time.sleep(10)
        stalled.send_signal(signal.SIGTERM)
        other.send_signal(signal.SIGTERM)
        codes = [stalled.wait(30), other.wait(30)]
        print(f"stalled instance: exit codes {codes}")
    finally:
        for process in (stalled, other):
            if process is not None and process.poll() is None:
                process.kill()
    got = merged_rows(bootstrap, sink)
    assert got.select(["window_start", *KEYS]).is_duplicated().sum() == 0, "duplicate window"
    assert_frame_equal(got, reference([t for _, t in data], SIZE_MS), check_exact=False,
                       rel_tol=1e-9, abs_tol=1e-9, check_dtypes=False)
