"""The sensor data the integration tests publish, the DuckDB reference they compare with, and
the output read back."""

from __future__ import annotations

import random

import duckdb
import polars as pl
import pyarrow as pa

from consumer.kafka.tail import read_output

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
