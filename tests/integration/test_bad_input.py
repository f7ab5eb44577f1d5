"""Bad input through Apache Kafka: rejected messages land in the DLQ with their reason and
origin, late rows in the late topic, and the good rows' aggregates are unaffected."""

from __future__ import annotations

import logging
import random
from functools import partial
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from confluent_kafka import Consumer, Producer
from polars.testing import assert_frame_equal

from tests.conftest import TopicFactory
from tests.integration.conftest import (
    RunningDaemon,
    daemon_settings,
    publish_tables,
    running_daemon,
    wait_all_committed,
    wait_for,
)
from tests.integration.data import T0, output_frame, sensor_table

pytestmark = pytest.mark.integration


Record = tuple[bytes | None, dict[str, bytes]]


def read_all(bootstrap: str, topic: str, expected: int) -> list[Record]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{topic}",
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    consumer.subscribe([topic])
    out: list[Record] = []
    try:
        for _ in range(60):
            for msg in consumer.consume(100, 0.5):
                if msg.error() is None:
                    raw = msg.headers()
                    pairs = raw.items() if isinstance(raw, dict) else raw or []
                    headers = {k: v for k, v in pairs if isinstance(v, bytes)}
                    out.append((msg.value(), headers))
            if len(out) >= expected:
                break
    finally:
        consumer.close()
    return out


def test_poison_messages_go_to_the_dlq_and_late_rows_to_the_late_topic(
    bootstrap: str, topic_factory: TopicFactory
) -> None:
    source, sink = topic_factory("in"), topic_factory("out")
    dlq, late = topic_factory("dlq"), topic_factory("late")
    rng = random.Random(3)
    good = [(0, sensor_table(rng, 50, T0 + i * 100, 100)) for i in range(30)]
    settings = daemon_settings(
        bootstrap, source, sink, output={"dlq_topic": dlq, "late_topic": late},
        window={"kind": "tumbling", "time": "event", "timestamp_column": "ts",
                "size_ms": 1000, "idle_timeout_ms": 1500})
    poison = [b"not arrow", b"", b"\xff" * 64, b"ARROW1\x00\x00garbage"]
    late_table = sensor_table(rng, 7, T0, 10)  # window [T0, T0+1000) is long closed
    with running_daemon(settings) as daemon:
        publish_tables(bootstrap, source, good[:15])
        producer = Producer({"bootstrap.servers": bootstrap})
        for value in poison:
            producer.produce(source, value, partition=0)
        assert producer.flush(10) == 0
        publish_tables(bootstrap, source, good[15:])
        wait_all_committed(daemon, settings, rows=30 * 50)
        publish_tables(bootstrap, source, [(0, late_table)], producer_id="late")
        progress = wait_all_committed(daemon, settings, rows=30 * 50 + 7)
        assert progress.counters.late_rows == 7
    assert daemon.processor.counters.rejected == len(poison)
    dead = read_all(bootstrap, dlq, len(poison))
    assert sorted(v or b"" for v, _ in dead) == sorted(poison)
    for _value, headers in dead:
        assert headers["arrowagg.dlq.original-topic"] == source.encode()
        assert headers["arrowagg.dlq.original-partition"] == b"0"
        assert int(headers["arrowagg.dlq.original-offset"]) >= 15
        assert headers["arrowagg.dlq.error-class"]
        assert headers["arrowagg.dlq.error-message"]
        assert headers["arrowagg.dlq.consumer-group"] == settings.kafka.group_id.encode()
    late_values = read_all(bootstrap, late, 1)
    late_rows = pa.concat_tables([pa.ipc.open_stream(v).read_all() for v, _ in late_values])
    assert late_rows.num_rows == 7
    assert sorted(late_rows["reading_sum"].to_pylist()) == sorted(
        late_table["reading_sum"].to_pylist())
    got, _ = output_frame(bootstrap, sink)
    good_rows = pa.concat_tables([t for _, t in good])
    assert int(got["row_count"].sum()) == good_rows.num_rows
    assert float(got["reading_sum"].sum()) == pytest.approx(
        pc.sum(good_rows["reading_sum"]).as_py(), rel=1e-9)


def test_a_rejection_says_its_reason_once_in_the_log_and_the_dlq(
    bootstrap: str, topic_factory: TopicFactory, caplog: pytest.LogCaptureFixture
) -> None:
    source, sink, dlq = topic_factory("in"), topic_factory("out"), topic_factory("dlq")
    settings = daemon_settings(
        bootstrap, source, sink, output={"dlq_topic": dlq},
        window={"kind": "tumbling", "time": "event", "timestamp_column": "ts",
                "size_ms": 1000, "idle_timeout_ms": 1000})
    good = sensor_table(random.Random(5), 10, T0, 100)
    with caplog.at_level(logging.WARNING, "consumer"), running_daemon(settings) as daemon:
        producer = Producer({"bootstrap.servers": bootstrap})
        producer.produce(source, b"hello, not arrow at all", partition=0)
        assert producer.flush(10) == 0
        publish_tables(bootstrap, source, [(0, good)])
        wait_all_committed(daemon, settings, rows=10)
    [(value, headers)] = read_all(bootstrap, dlq, 1)
    assert value == b"hello, not arrow at all"
    assert headers["arrowagg.dlq.error-class"] == b"not-arrow-ipc"
    message = headers["arrowagg.dlq.error-message"].decode()
    assert "not-arrow-ipc" not in message
    assert message  # the explanation itself
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("rejected ")]
    assert line == f"rejected {source}[0]@0: not-arrow-ipc: {message}"


def rows_taken(daemon: RunningDaemon, rows: int) -> bool:
    return daemon.processor.progress.counters.rows >= rows


def test_a_pinned_plan_survives_a_first_message_with_an_extra_key(
    bootstrap: str, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """Issue 35: a 2-row message with an extra string column, read first, fixed the plan
    and sent the 600 rows after it to the DLQ. Unpinned, that still happens, and the dead
    letter says which plan and where it came from; pinned by aggregation.schema_from,
    every row is aggregated (against DuckDB)."""
    rng = random.Random(35)
    large = sensor_table(rng, 600, T0, 900)
    # Two seconds of event time before the large message: its window may close (the idle
    # timeout) before the large one is published, which then comes after it, never late.
    # (In one window, a busy machine once let the idle timeout close it first, and the
    # 600 rows came late.)
    small = sensor_table(rng, 2, T0 - 2000, 900)
    small = small.append_column("region", pa.array(["eu", "us"]))
    sample = tmp_path / "sample.arrows"
    with pa.ipc.new_stream(str(sample), large.schema) as writer:
        writer.write_table(large.slice(0, 1))
    for pinned in (False, True):
        source, sink, dlq = (topic_factory("in", partitions=2), topic_factory("out"),
                             topic_factory("dlq"))
        settings = daemon_settings(
            bootstrap, source, sink, output={"dlq_topic": dlq},
            aggregation={"schema_from": str(sample)} if pinned else {},
            window={"kind": "tumbling", "time": "event", "timestamp_column": "ts",
                    "size_ms": 1000, "idle_timeout_ms": 1000})
        with running_daemon(settings) as daemon:
            publish_tables(bootstrap, source, [(1, small)])
            wait_for(partial(rows_taken, daemon, 2), timeout_s=60,
                     what="the small message read first")
            publish_tables(bootstrap, source, [(0, large)])
            wait_all_committed(daemon, settings, rows=602 if pinned else 2)
        if not pinned:
            [(_, headers)] = read_all(bootstrap, dlq, 1)
            assert headers["arrowagg.dlq.error-message"].decode() == (
                "missing key/time columns ['region']; checked against the plan from the "
                f"first message with rows, {source}[1]@0 (pin the plan: "
                "aggregation.schema_from)")
            continue
        got, _ = output_frame(bootstrap, sink)
        every_row = pa.concat_tables([large, small.drop_columns(["region"])])  # noqa: F841
        relation = duckdb.sql("""
            SELECT (epoch_ms(ts) // 1000) * 1000 AS window_start, site, sensor, "zone name",
                   sum(reading_sum) AS reading_sum, count(*) AS row_count
            FROM every_row GROUP BY ALL""")
        assert relation is not None
        expected = relation.pl()
        assert_frame_equal(
            got.select(expected.columns), expected, check_row_order=False,
            check_dtypes=False, check_exact=False, rel_tol=1e-9)
        assert daemon.processor.counters.rejected == 0
