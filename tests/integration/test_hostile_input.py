"""Input that used to crash-loop the daemon or ruin its windows, through Apache Kafka:
a late burst bigger than the late topic takes, a dead letter bigger than the DLQ topic
takes, a row from the year 2200 (and a commit it poisoned), a first message without
rows, a producer that drops an aggregate column."""

from __future__ import annotations

import logging
import random

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from polars.testing import assert_frame_equal

from consumer.core.offsets import CommitMetadata
from tests.conftest import TopicFactory
from tests.integration.conftest import (
    daemon_settings,
    publish_tables,
    running_daemon,
    wait_all_committed,
)
from tests.integration.data import KEYS, T0, output_frame, reference, sensor_table
from tests.integration.faults import read_topic
from wire.input import decode_ipc_stream, encode_ipc_stream

pytestmark = pytest.mark.integration

SIZE_MS = 1_000
YEAR_2200_MS = 7_258_118_400_000
LIMIT = 100_000  # output.max_message_bytes in these tests
TOPIC_LIMIT = str(150_000)  # max.message.bytes of the late and dead-letter topics


def window(**extra: object) -> dict[str, object]:
    return {"kind": "tumbling", "time": "event", "timestamp_column": "ts", "size_ms": SIZE_MS,
            "idle_timeout_ms": 1_500, **extra}


def on_time(windows: int, rng: random.Random) -> list[tuple[int, pa.Table]]:
    return [(0, sensor_table(rng, 60, T0 + w * SIZE_MS, SIZE_MS)) for w in range(windows)]


def produce_raw(bootstrap: str, topic: str, value: bytes) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 6_000_000})
    producer.produce(topic, value, partition=0)
    assert producer.flush(30) == 0


def sorted_rows(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.drop("window_end").sort(["window_start", *KEYS])


def test_a_late_burst_and_a_huge_dead_letter_fit_their_topics_and_the_daemon_goes_on(
    bootstrap: str, topic_factory: TopicFactory,
) -> None:
    source = topic_factory("in", config={"max.message.bytes": "5000000"})
    sink = topic_factory("out")
    late = topic_factory("late", config={"max.message.bytes": TOPIC_LIMIT})
    dlq = topic_factory("dlq", config={"max.message.bytes": TOPIC_LIMIT})
    rng = random.Random(5)
    data = on_time(6, rng)
    burst = sensor_table(rng, 8_000, T0, SIZE_MS)  # all for window 0, long closed
    settings = daemon_settings(bootstrap, source, sink, window=window(),
                               output={"late_topic": late, "dlq_topic": dlq,
                                       "max_message_bytes": LIMIT})
    huge = bytes(rng.getrandbits(8) for _ in range(3_000_000))  # not Arrow, 3 MB
    with running_daemon(settings) as daemon:
        publish_tables(bootstrap, source, data)
        wait_all_committed(daemon, settings, rows=6 * 60)
        assert len(encode_ipc_stream(burst, "zstd")) > int(TOPIC_LIMIT)  # one record won't do
        publish_tables(bootstrap, source, [(0, burst)], producer_id="replayer")
        produce_raw(bootstrap, source, huge)
        progress = wait_all_committed(daemon, settings, rows=6 * 60 + 8_000)
    assert progress.counters.late_rows == 8_000
    late_records = read_topic(bootstrap, late, 1)
    assert len(late_records) > 1
    assert all(len(r.value) <= LIMIT for r in late_records)
    rows = pa.concat_tables([decode_ipc_stream(r.value) for r in late_records])
    assert rows.num_rows == 8_000
    assert sorted(rows.column("reading_sum").to_pylist()) == sorted(
        burst.column("reading_sum").to_pylist())
    headers = late_records[0].headers
    assert headers["arrowagg.late.original-topic"] == source.encode()
    assert headers["arrowagg.late.original-offset"] == b"6"
    assert headers["arrowagg.window-start"] == str(T0).encode()
    assert headers["arrowagg.window-end"] == str(T0 + SIZE_MS).encode()
    (dead,) = read_topic(bootstrap, dlq, 1)
    assert len(dead.value) < LIMIT
    assert dead.value == huge[:len(dead.value)]
    assert dead.headers["arrowagg.dlq.truncated"] == b"true"
    assert dead.headers["arrowagg.dlq.original-size"] == b"3000000"
    assert dead.headers["arrowagg.dlq.original-offset"] == b"7"
    got, _ = output_frame(bootstrap, sink)
    assert_frame_equal(sorted_rows(got), reference([t for _, t in data], SIZE_MS),
                       check_exact=False, rel_tol=1e-9, abs_tol=1e-9, check_dtypes=False)


def test_a_row_from_the_year_2200_is_dead_lettered_and_the_windows_go_on(
    bootstrap: str, topic_factory: TopicFactory,
) -> None:
    source, sink, dlq = topic_factory("in"), topic_factory("out"), topic_factory("dlq")
    rng = random.Random(6)
    data = on_time(8, rng)
    poisoned = sensor_table(rng, 10, T0 + 3 * SIZE_MS, SIZE_MS)
    ts = poisoned.column("ts").to_pylist()
    ts[4] = YEAR_2200_MS
    poisoned = poisoned.set_column(poisoned.schema.get_field_index("ts"), "ts",
                                   pa.array(ts, pa.timestamp("ms", "UTC")))
    settings = daemon_settings(bootstrap, source, sink, window=window(),
                               output={"dlq_topic": dlq})
    published = [*data[:3], (0, poisoned), *data[3:]]
    with running_daemon(settings) as daemon:
        publish_tables(bootstrap, source, published)
        progress = wait_all_committed(daemon, settings, rows=8 * 60 + 9)
    assert progress.counters.late_rows == 0, "the row from 2200 moved no watermark"
    assert progress.counters.rejected_rows == 1
    (dead,) = read_topic(bootstrap, dlq, 1)
    assert dead.headers["arrowagg.dlq.error-class"] == b"future-event-time"
    assert dead.headers["arrowagg.dlq.rows"] == b"1"
    assert decode_ipc_stream(dead.value).column("ts").cast(pa.int64()).to_pylist() == [
        YEAR_2200_MS]
    sent = pa.concat_tables([t for _, t in published])
    kept = sent.filter(pc.less(sent.column("ts").cast(pa.int64()), YEAR_2200_MS))
    got, _ = output_frame(bootstrap, sink)
    assert_frame_equal(sorted_rows(got), reference([kept], SIZE_MS), check_exact=False,
                       rel_tol=1e-9, abs_tol=1e-9, check_dtypes=False)


def test_a_commit_poisoned_before_the_guard_does_not_come_back_after_a_restart(
    bootstrap: str, topic_factory: TopicFactory,
) -> None:
    source, sink = topic_factory("in"), topic_factory("out")
    rng = random.Random(7)
    data = on_time(5, rng)
    settings = daemon_settings(bootstrap, source, sink, window=window())
    publish_tables(bootstrap, source, data[:1])
    # What an older daemon committed after a row from 2200 went through: its frontier and
    # largest event time in 2200, the offset past the message.
    poisoned = CommitMetadata(frontier=YEAR_2200_MS, position=1, max_event_ms=YEAR_2200_MS)
    committer = Consumer({"bootstrap.servers": bootstrap, "group.id": settings.kafka.group_id})
    committer.commit(offsets=[TopicPartition(source, 0, 1, metadata=poisoned.encode())],
                     asynchronous=False)
    committer.close()
    with running_daemon(settings) as daemon:
        publish_tables(bootstrap, source, data[1:], producer_id="after")
        progress = wait_all_committed(daemon, settings, rows=4 * 60)
    assert progress.counters.late_rows == 0
    got, _ = output_frame(bootstrap, sink)
    assert_frame_equal(sorted_rows(got), reference([t for _, t in data[1:]], SIZE_MS),
                       check_exact=False, rel_tol=1e-9, abs_tol=1e-9, check_dtypes=False)


def test_a_first_message_without_rows_leaves_the_plan_to_the_data(
    bootstrap: str, topic_factory: TopicFactory,
) -> None:
    source, sink, dlq = topic_factory("in"), topic_factory("out"), topic_factory("dlq")
    rng = random.Random(8)
    data = on_time(4, rng)
    warm_up = pa.table({"hello": pa.array([], pa.int64())})
    settings = daemon_settings(bootstrap, source, sink, window=window(),
                               output={"dlq_topic": dlq})
    with running_daemon(settings) as daemon:
        publish_tables(bootstrap, source, [(0, warm_up), *data])
        progress = wait_all_committed(daemon, settings, rows=4 * 60)
    assert progress.counters.rejected == 0
    assert read_topic(bootstrap, dlq, 1, quiet_s=1.0) == []
    got, _ = output_frame(bootstrap, sink)
    assert_frame_equal(sorted_rows(got), reference([t for _, t in data], SIZE_MS),
                       check_exact=False, rel_tol=1e-9, abs_tol=1e-9, check_dtypes=False)


def test_a_dropped_aggregate_column_counts_as_null_and_is_logged(
    bootstrap: str, topic_factory: TopicFactory, caplog: pytest.LogCaptureFixture,
) -> None:
    source, sink = topic_factory("in"), topic_factory("out")
    rng = random.Random(9)
    data = on_time(6, rng)
    # From the third message on, the workers no longer send "power".
    sent = [(p, t if i < 2 else t.drop_columns(["power"])) for i, (p, t) in enumerate(data)]
    as_null = [t if "power" in t.column_names
               else t.append_column("power", pa.nulls(t.num_rows, pa.float64()))
               .select(data[0][1].column_names) for _, t in sent]
    settings = daemon_settings(bootstrap, source, sink, window=window())
    with caplog.at_level(logging.WARNING, logger="consumer.core.decode"), \
            running_daemon(settings) as daemon:
        publish_tables(bootstrap, source, sent)
        wait_all_committed(daemon, settings, rows=6 * 60)
    assert [r.getMessage() for r in caplog.records if "without aggregate" in r.getMessage()] \
        == [("messages without aggregate column(s) ['power']: counted as null there "
            "(docs/reliability.md, schema evolution)")]
    got, _ = output_frame(bootstrap, sink)
    assert_frame_equal(sorted_rows(got), reference(as_null, SIZE_MS), check_exact=False,
                       rel_tol=1e-9, abs_tol=1e-9, check_dtypes=False)
