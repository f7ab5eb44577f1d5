"""Aggregates that do not decompose (median, quantile, n_unique and user expressions)
through Apache Kafka: the daemon buffers each window's values and its results equal
DuckDB's median, quantile_cont, count(DISTINCT) and the SQL the expressions stand for."""

from __future__ import annotations

import duckdb
import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

from tests.conftest import TopicFactory
from tests.integration.conftest import (
    daemon_settings,
    publish_tables,
    running_daemon,
    wait_all_committed,
    wait_for,
)
from tests.integration.data import make_input, output_frame

pytestmark = pytest.mark.integration

SIZE_MS = 500
AGGREGATION = {
    "keys": ["site"],
    "columns": {"reading_min": "median", "reading_max": {"quantile": 0.9},
                "sensor": "n_unique", "power": "sum"},
    "expressions": {"error_share": "(pl.col('error_count') > 0).mean()",
                    "power_range": "pl.col('power').max() - pl.col('power').min()"},
}


def duckdb_reference(tables: list[pa.Table]) -> pl.DataFrame:
    rows = pa.concat_tables(tables)  # noqa: F841 - read by DuckDB's replacement scan
    relation = duckdb.sql(f"""
        SELECT (epoch_ms(ts) // {SIZE_MS}) * {SIZE_MS} AS window_start, site,
               median(reading_min) AS reading_min,
               quantile_cont(reading_max, 0.9) AS reading_max,
               count(DISTINCT sensor)::BIGINT AS sensor,
               sum(power) AS power,
               avg(CASE WHEN error_count > 0 THEN 1.0 ELSE 0.0 END)::DOUBLE AS error_share,
               max(power) - min(power) AS power_range,
               count(*)::BIGINT AS row_count
        FROM rows GROUP BY ALL
    """)  # noqa: S608 - only an integer is formatted in
    assert relation is not None
    return pl.DataFrame(relation.arrow()).sort("window_start", "site")


def test_median_quantile_n_unique_and_expressions_equal_duckdb(
    bootstrap: str, topic_factory: TopicFactory
) -> None:
    source, sink = topic_factory("in", partitions=3), topic_factory("out")
    data = make_input(batches_per_producer=50, producers=3, span_ms=40)
    total_rows = sum(t.num_rows for _, t in data)
    settings = daemon_settings(
        bootstrap, source, sink, aggregation=AGGREGATION,
        window={"kind": "tumbling", "time": "event", "timestamp_column": "ts",
                "size_ms": SIZE_MS, "allowed_lateness_ms": 0, "idle_timeout_ms": 1500})
    with running_daemon(settings) as daemon:
        publish_tables(bootstrap, source, data)
        wait_for(lambda: daemon.processor.progress.counters.rows == total_rows, timeout_s=60,
                 what="the daemon to take every row")
        wait_for(lambda: daemon.processor.progress.settled, timeout_s=30,
                 what="every window closed and committed")
        wait_all_committed(daemon, settings, rows=total_rows)
    got, starts = output_frame(bootstrap, sink)
    expected = duckdb_reference([t for _, t in data])

    assert sorted(starts) == sorted(set(starts)), "a window was emitted twice"
    assert set(expected.columns) <= set(got.columns)  # and the default rules' columns
    assert daemon.processor.counters.late_rows == 0
    assert_frame_equal(got.select(expected.columns).sort("window_start", "site"), expected,
                       check_exact=False, rel_tol=1e-9, abs_tol=1e-9, check_dtypes=False)
