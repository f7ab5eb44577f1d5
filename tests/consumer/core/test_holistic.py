"""Aggregates that do not decompose (median, quantile, n_unique, user expressions): the
engines' results against DuckDB SQL over the same rows, whatever the split into polls.

``quantile`` interpolates linearly: DuckDB's ``quantile_cont`` (its ``median`` is
``quantile_cont(x, 0.5)``); ``n_unique`` is ``count(DISTINCT x)``. An expression with
``interpolation='lower'`` is DuckDB's ``quantile_disc``.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from consumer.core.budget import GroupBudget
from consumer.core.plan import AggregationPlan, PlanError, Quantile, derive_plan
from consumer.core.types import ClosedWindow, MessageRef
from consumer.core.windows.bounds import WindowSpec
from consumer.core.windows.count.engine import CountWindowEngine
from consumer.core.windows.time.engine import TimeWindowEngine

P0 = ("events", 0)
UTC_MS = pl.Datetime("ms", "UTC")
SIZE_MS = 1_000
SCHEMA = pa.schema([
    ("host", pa.string()), ("ts", pa.timestamp("ms", "UTC")), ("latency", pa.float64()),
    ("status", pa.int32()), ("bytes", pa.int64()),
])
PLAN = derive_plan(
    SCHEMA, time_column="ts", keys=["host"],
    overrides={"latency": "median", "status": "n_unique", "bytes": Quantile(0.9)},
    expressions={
        "p99": "pl.col('latency').quantile(0.99, 'linear')",
        "p25_disc": "pl.col('latency').quantile(0.25, interpolation='lower')",
        "error_rate": "(pl.col('status') >= 500).mean()",
        "ok_bytes": "pl.col('bytes').filter(pl.col('status') < 500).sum()",
    })
REFERENCE_SQL = f"""
SELECT (epoch_ms(ts) // {SIZE_MS}) * {SIZE_MS} AS window_start, host,
       median(latency) AS latency,
       count(DISTINCT status) AS status,
       quantile_cont(bytes, 0.9) AS bytes,
       quantile_cont(latency, 0.99) AS p99,
       quantile_disc(latency, 0.25) AS p25_disc,
       avg(CASE WHEN status >= 500 THEN 1.0 WHEN status IS NULL THEN NULL ELSE 0.0 END)
           AS error_rate,
       -- Polars' sum of nothing is 0, SQL's is NULL: expressions are Polars'.
       coalesce(sum(bytes) FILTER (WHERE status < 500), 0)::BIGINT AS ok_bytes,
       count(*) AS row_count
FROM rows GROUP BY ALL ORDER BY ALL
"""  # noqa: S608 - only integers are formatted in

Row = tuple[str | None, int, float | None, int | None, int | None]


def table(rows: Sequence[Row]) -> pa.Table:
    columns = [[row[i] for row in rows] for i in range(len(SCHEMA))]
    return pa.table(dict(zip(SCHEMA.names, columns, strict=True)), schema=SCHEMA)


def engine(plan: AggregationPlan = PLAN, merge_every: int = 2) -> TimeWindowEngine:
    return TimeWindowEngine(plan, WindowSpec.tumbling(SIZE_MS), event_time=True,
                            time_dtype=UTC_MS, allowed_lateness_ms=0, idle_timeout_ms=60_000,
                            merge_every=merge_every)


def run(polls: Sequence[Sequence[Row]], plan: AggregationPlan = PLAN) -> pl.DataFrame:
    """Feed each poll as one message, then close everything; all windows' results."""
    windows = engine(plan)
    windows.assign(P0, None, None, 0)
    offset = 0
    for rows in polls:
        if not rows:
            continue
        times = [r[1] for r in rows]
        windows.add(pl.DataFrame(table(rows)), [MessageRef(P0, offset, len(rows), min(times),
                                                           max(times))], 0)
        offset += 1
    return results(windows.close_due(10**9))


def results(closed: Sequence[ClosedWindow]) -> pl.DataFrame:
    frames = [w.frame for w in closed]
    if not frames:
        return pl.DataFrame()
    out = pl.concat(frames).drop("window_end")
    return out.with_columns(pl.col("window_start").dt.epoch("ms")).sort("window_start", "host")


def reference(rows: Sequence[Row]) -> pl.DataFrame:
    data = table(rows)  # noqa: F841 - read by DuckDB's replacement scan
    relation = duckdb.sql(REFERENCE_SQL.replace("FROM rows", "FROM data"))
    assert relation is not None
    return pl.DataFrame(relation.arrow())


def same(got: pl.DataFrame, expected: pl.DataFrame) -> None:
    # Exact but for the rounding of an interpolated quantile, which Polars and DuckDB
    # compute in different orders (0.9900000000000002 against 0.99 between 0 and 1;
    # inputs here are at most 1e3, 1e6 for bytes).
    assert_frame_equal(got, expected.sort("window_start", "host"), check_dtypes=False,
                       check_exact=False, rel_tol=1e-12, abs_tol=1e-9)


hosts = st.none() | st.sampled_from(["a", "b", "c d"])
rows_strategy = st.lists(st.tuples(
    hosts, st.integers(0, 2_999),
    st.none() | st.floats(-1e3, 1e3, allow_nan=False).map(lambda x: round(x, 3)),
    st.none() | st.sampled_from([200, 204, 404, 500, 503]),
    st.none() | st.integers(0, 10**6),
), min_size=1, max_size=80)


@given(rows=rows_strategy, cuts=st.lists(st.integers(0, 80), max_size=6))
def test_any_split_into_polls_equals_one_sql_query(rows: list[Row], cuts: list[int]) -> None:
    points = sorted({0, *(c for c in cuts if c < len(rows)), len(rows)})
    polls = [rows[a:b] for a, b in pairwise(points)]
    same(run(polls), reference(rows))


def test_median_and_quantile_of_even_counts_interpolate() -> None:
    rows: list[Row] = [("a", 10, 1.0, 200, 10), ("a", 20, 2.0, 200, 20),
                       ("a", 30, 4.0, 500, 30), ("a", 40, 8.0, 500, 40)]
    got = run([rows[:1], rows[1:3], rows[3:]])
    assert got["latency"].to_list() == [3.0]  # (2 + 4) / 2
    assert got["bytes"].to_list() == [pytest.approx(37.0)]  # 30 + 0.7 * (40 - 30)
    assert got["status"].to_list() == [2]
    same(got, reference(rows))


def test_all_null_values_give_null_and_zero_distinct() -> None:
    rows: list[Row] = [("a", 10, None, None, None), (None, 20, None, None, None)]
    got = run([rows])
    assert got["latency"].to_list() == [None, None]
    assert got["status"].to_list() == [0, 0]
    same(got, reference(rows))


def test_windows_close_separately_and_keep_their_own_values() -> None:
    windows = engine()
    windows.assign(P0, None, None, 0)
    early: list[Row] = [("a", 100, 1.0, 200, 1), ("a", 200, 3.0, 500, 2)]
    late: list[Row] = [("a", 1_100, 10.0, 200, 5)]
    both = early + late
    windows.add(pl.DataFrame(table(both)), [MessageRef(P0, 0, 3, 100, 1_100)], 0)
    first = windows.close_due(0)  # the watermark (1100) closes [0, 1000) only
    assert [w.start_ms for w in first] == [0]
    assert windows.buffered_values() == 3  # one row left, three buffered columns
    rest = windows.close_due(10**9)
    same(results([*first, *rest]), reference(both))


def test_count_windows_buffer_too() -> None:
    count = CountWindowEngine(PLAN, batches=2, rows=None, idle_timeout_ms=60_000,
                              merge_every=2)
    count.assign(P0, None, None, 0)
    rows: list[Row] = [("a", 5, 1.0, 200, 1), ("a", 6, 5.0, 200, 2), ("b", 7, 2.0, 500, 3)]
    count.add(pl.DataFrame(table(rows[:1])), [MessageRef(P0, 0, 1)], 0)
    count.add(pl.DataFrame(table(rows[1:])), [MessageRef(P0, 1, 2)], 0)
    (window,) = count.close_due(0)
    assert window.frame.sort("host")["latency"].to_list() == [3.0, 2.0]
    assert window.frame.sort("host")["p99"].to_list() == [pytest.approx(4.96), 2.0]


def test_result_columns_follow_the_plan() -> None:
    got = run([[("a", 10, 1.0, 200, 10)]])
    assert got.columns == ["window_start", "host", "latency", "status", "bytes", "p99",
                           "p25_disc", "error_rate", "ok_bytes", "row_count"]
    assert got.schema["status"] == pl.Int64


def test_a_plan_mixing_both_kinds_merges_one_and_buffers_the_other() -> None:
    plan = derive_plan(SCHEMA, time_column="ts", keys=["host"],
                       overrides={"latency": "median", "status": "count", "bytes": "sum"})
    assert plan.buffered_columns == ("latency",)
    rows: list[Row] = [("a", 10, 1.0, 200, 10), ("a", 20, None, None, 5),
                       ("b", 30, 7.0, 500, None)]
    got = run([rows[:2], rows[2:]], plan)
    sql = f"""SELECT (epoch_ms(ts) // {SIZE_MS}) * {SIZE_MS} AS window_start, host,
                     median(latency) AS latency, count(status) AS status,
                     sum(bytes)::BIGINT AS bytes, count(*) AS row_count
              FROM data GROUP BY ALL ORDER BY ALL"""  # noqa: S608
    data = table(rows)  # noqa: F841 - read by DuckDB's replacement scan
    relation = duckdb.sql(sql)
    assert relation is not None
    same(got, pl.DataFrame(relation.arrow()))


def test_dictionary_keys_join_their_buffered_results() -> None:
    rows: list[Row] = [("a", 10, 1.0, 200, 1), (None, 20, 2.0, 200, 2), ("a", 30, 5.0, 500, 3)]
    encoded = table(rows)
    encoded = encoded.set_column(0, "host", encoded.column("host").dictionary_encode())
    windows = engine()
    windows.assign(P0, None, None, 0)
    windows.add(pl.DataFrame(encoded), [MessageRef(P0, 0, 3, 10, 30)], 0)
    got = results(windows.close_due(10**9)).with_columns(pl.col("host").cast(pl.String))
    same(got, reference(rows))


def test_buffered_values_count_against_the_budget() -> None:
    budget = GroupBudget(1_000, "emit_early", max_values=10)
    assert not budget.check(2, [], values=9).emit_early
    assert budget.check(2, [], values=10).emit_early
    assert budget.used(500, 2) == 0.5


@pytest.mark.parametrize(("overrides", "message"), [
    ({"host": "median"}, "group key"),
    ({"latency": Quantile(1.5)}, "quantile 1.5 is not between 0 and 1"),
])
def test_bad_holistic_configuration(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(PlanError, match=message):
        derive_plan(SCHEMA, time_column="ts", overrides=overrides)


def test_median_of_a_string_is_refused() -> None:
    schema = pa.schema([("k", pa.string()), ("name", pa.string())])
    with pytest.raises(PlanError, match="median needs a numeric column"):
        derive_plan(schema, keys=["k"], overrides={"name": "median"})


def test_n_unique_of_strings_is_count_distinct() -> None:
    schema = pa.schema([("k", pa.string()), ("user", pa.string())])
    plan = derive_plan(schema, keys=["k"], overrides={"user": "n_unique"})
    frame = pl.DataFrame({"k": ["x", "x", "x", "y"], "user": ["u1", "u2", "u1", None]})
    count = CountWindowEngine(plan, batches=1, rows=None, idle_timeout_ms=60_000,
                              merge_every=2)
    count.assign(P0, None, None, 0)
    count.add(frame, [MessageRef(P0, 0, 4)], 0)
    (window,) = count.close_due(0)
    data = frame.to_arrow()  # noqa: F841 - read by DuckDB's replacement scan
    relation = duckdb.sql("SELECT k, count(DISTINCT user) AS user, count(*) AS row_count "
                          "FROM data GROUP BY k ORDER BY k")
    assert relation is not None
    assert_frame_equal(window.frame.drop("window_start", "window_end").sort("k"),
                       pl.DataFrame(relation.arrow()), check_dtypes=False)
