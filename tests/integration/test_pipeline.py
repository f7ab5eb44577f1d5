"""End to end through Apache Kafka: several producers and partitions in, windows out,
compared with an independent DuckDB recomputation over the same input rows."""

from __future__ import annotations

import random
import time

import duckdb
import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

from consumer.kafka.tail import read_output
from tests.conftest import TopicFactory
from tests.integration.conftest import (
    daemon_settings,
    publish_tables,
    running_daemon,
    wait_all_committed,
    wait_for,
)

pytestmark = pytest.mark.integration

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
KEYS = ["site", "sensor", "zone name"]


def sensor_table(rng: random.Random, rows: int, start_ms: int, span_ms: int) -> pa.Table:
    """Seed-style batch: string keys (one with a space in its name), a timestamp,
    *_sum/*_count/*_min/*_max columns, plain numerics, and a bool the plan skips."""
    return pa.table({
        "site": pa.array([f"site-{rng.randrange(3)}" for _ in range(rows)]),
        "sensor": pa.array([rng.choice(["ünï", "b \"q\"", "c"]) for _ in range(rows)]),
        "zone name": pa.array([rng.choice(["north", "south"]) for _ in range(rows)]),
        "ts": pa.array([start_ms + rng.randrange(span_ms) for _ in range(rows)],
                       pa.timestamp("ms", tz="UTC")),
        "reading_sum": pa.array([rng.uniform(-50, 50) for _ in range(rows)]),
        "reading_count": pa.array([rng.randrange(1, 5) for _ in range(rows)], pa.int64()),
        "reading_min": pa.array([rng.uniform(-100, 0) for _ in range(rows)]),
        "reading_max": pa.array([rng.uniform(0, 100) for _ in range(rows)]),
        "power": pa.array([rng.uniform(0, 10) for _ in range(rows)]),
        "error_count": pa.array([rng.randrange(0, 3) for _ in range(rows)], pa.int32()),
        "δ_max": pa.array([rng.randrange(-1000, 1000) for _ in range(rows)], pa.int64()),
        "ok": pa.array([rng.random() < 0.5 for _ in range(rows)]),
    })


def make_input(batches_per_producer: int, producers: int, span_ms: int,
               ) -> list[tuple[int, pa.Table]]:
    """Each producer writes its own partition in event-time order (no late rows)."""
    rng = random.Random(7)
    out = []
    for batch in range(batches_per_producer):
        for producer in range(producers):
            rows = rng.randrange(20, 120)
            out.append((producer, sensor_table(rng, rows, T0 + batch * span_ms, span_ms)))
    return out


def reference(tables: list[pa.Table], size_ms: int) -> pl.DataFrame:
    """GROUP BY window and keys in DuckDB SQL, independent of the code under test."""
    rows = pa.concat_tables(tables)  # noqa: F841 - read by DuckDB's replacement scan
    sql = f"""
        SELECT (epoch_ms(ts) // {size_ms}) * {size_ms} AS window_start,
               site, sensor, "zone name",
               SUM(reading_sum) AS reading_sum, SUM(reading_count)::BIGINT AS reading_count,
               MIN(reading_min) AS reading_min, MAX(reading_max) AS reading_max,
               SUM(power) AS power, SUM(error_count)::BIGINT AS error_count,
               MAX("δ_max") AS "δ_max", COUNT(*)::BIGINT AS row_count
        FROM rows GROUP BY ALL
    """  # noqa: S608 - only integers are formatted in
    relation = duckdb.sql(sql)
    assert relation is not None
    return pl.DataFrame(relation.arrow()).sort(["window_start", *KEYS])


def output_frame(bootstrap: str, topic: str) -> tuple[pl.DataFrame, list[int]]:
    windows = list(read_output(bootstrap, topic, idle_timeout_s=3.0))
    frame = pl.concat([w.frame for w in windows])
    frame = frame.with_columns(pl.col("window_start").dt.epoch("ms").alias("window_start"))
    return frame, [w.start_ms for w in windows]


def test_event_time_windows_equal_the_reference(
    bootstrap: str, topic_factory: TopicFactory
) -> None:
    source = topic_factory("in", partitions=3)
    sink = topic_factory("out")
    size_ms, span_ms = 500, 40
    data = make_input(batches_per_producer=70, producers=3, span_ms=span_ms)
    total_rows = sum(t.num_rows for _, t in data)
    settings = daemon_settings(bootstrap, source, sink, window={
        "kind": "tumbling", "time": "event", "timestamp_column": "ts", "size_ms": size_ms,
        "allowed_lateness_ms": 0, "idle_timeout_ms": 1500,
    })
    with running_daemon(settings) as daemon:
        publish_tables(bootstrap, source, data[: len(data) // 2], producer_id="w1")
        publish_tables(bootstrap, source, data[len(data) // 2 :], producer_id="w2")
        wait_for(lambda: daemon.processor.progress.counters.rows == total_rows, timeout_s=60,
                 what="the daemon to take every row")
        input_stopped = time.monotonic()
        wait_for(lambda: daemon.processor.progress.settled, timeout_s=30,
                 what="every window closed and committed")
        closed_after_s = time.monotonic() - input_stopped
        wait_all_committed(daemon, settings, rows=total_rows)
    got, starts = output_frame(bootstrap, sink)
    expected = reference([t for _, t in data], size_ms)

    assert sorted(starts) == sorted(set(starts)), "a window was emitted twice"
    assert got.columns == ["window_start", "window_end", *KEYS, "reading_sum", "reading_count",
                           "reading_min", "reading_max", "power", "error_count", "δ_max",
                           "row_count"]
    assert int(got["row_count"].sum()) == total_rows
    assert daemon.processor.counters.late_rows == 0
    assert_frame_equal(got.drop("window_end").sort(["window_start", *KEYS]), expected,
                       check_exact=False, rel_tol=1e-9, abs_tol=1e-9, check_dtypes=False)
    assert (got["window_end"].dt.epoch("ms") - got["window_start"] == size_ms).all()
    # Idle close: once input stops, the last windows come out within idle_timeout + one
    # window (1.5 s + 0.5 s here; the rest is polling and commit slack).
    print(f"idle close: last windows closed {closed_after_s:.2f}s after the input stopped")
    assert closed_after_s < 1.5 + 0.5 + 1.0
