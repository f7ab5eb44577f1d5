"""decimal128 columns (money, from databases and Parquet) are aggregated, not skipped:
sum, min and max exactly, as decimal128(38, scale) like SQL's SUM(DECIMAL); mean as a
double. On one instance, under early revisions, in sessions and through both stages of
the scale-out, against DuckDB over the same rows."""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

from consumer.compose import build_pipeline
from consumer.config import plan_for, settings_from_dict
from consumer.core.types import InputMessage, OutputRecord
from tests.consumer.modes import (
    NOW_MS,
    SOURCE,
    T0,
    TUMBLING,
    committed,
    config,
    scale_out_records,
)
from wire.input import encode_ipc_stream
from wire.output import OutputWindow, decode_message

MONEY = pa.decimal128(12, 2)


def batch(start_ms: int, seed: int) -> pa.Table:
    rng = random.Random(seed)
    cents = [rng.randrange(-10**11, 10**11) for _ in range(40)]
    return pa.table({
        "site": [f"s{i % 3}" for i in range(40)],
        "ts": pa.array([start_ms + 10 * i for i in range(40)], pa.timestamp("ms", "UTC")),
        "amount": pa.array([None if i % 7 == 0 else Decimal(c).scaleb(-2)
                            for i, c in enumerate(cents)], MONEY),
        "amount_max": pa.array([Decimal(c).scaleb(-2) for c in cents], MONEY),
        "price": pa.array([Decimal(c).scaleb(-2) for c in cents], MONEY),
    })


BATCHES = [batch(T0 + i * 1_000, seed=i) for i in range(3)]
AGGREGATION = {"columns": {"price": "mean"}}


def reference(tables: list[pa.Table], group: str) -> pl.DataFrame:
    every_row = pa.concat_tables(tables)  # noqa: F841 - read by DuckDB
    relation = duckdb.sql(f"""
        SELECT {group}, site, sum(amount) AS amount, max(amount_max) AS amount_max,
               avg(price)::DOUBLE AS price, count(*) AS row_count
        FROM every_row GROUP BY ALL""")  # noqa: S608 - the group expression is ours
    assert relation is not None
    frame: pl.DataFrame = relation.pl()
    return frame


def results(records: list[OutputRecord]) -> pl.DataFrame:
    frames = []
    for record in records:
        message = decode_message(record.value, record.headers)
        if record.topic == "out" and isinstance(message, OutputWindow):
            frames.append(message.frame)
    return pl.concat(frames)


def one_instance(data: dict[str, Any]) -> pl.DataFrame:
    pipe = build_pipeline(settings_from_dict(data))
    pipe.assign(SOURCE, None, None, NOW_MS)
    records = []
    for offset, table in enumerate(BATCHES):
        pipe.process([InputMessage(SOURCE, offset, encode_ipc_stream(table))], NOW_MS)
        records += committed(pipe, NOW_MS)
    return results(records + committed(pipe, NOW_MS + 120_000, force=True))


def test_the_plan_sums_decimals_and_keeps_their_scale() -> None:
    plan = plan_for(settings_from_dict(config(TUMBLING, aggregation=AGGREGATION)),
                    BATCHES[0].schema)
    assert [(a.name, a.func) for a in plan.aggregates] == [
        ("amount", "sum"), ("amount_max", "max"), ("price", "mean")]
    assert plan.skipped == ()


WINDOW = "(epoch_ms(ts) // 1000) * 1000 AS window_start"


@pytest.mark.parametrize("mode", ["one instance", "scale-out"])
def test_decimals_sum_and_max_exactly_per_window(mode: str) -> None:
    if mode == "scale-out":
        got = results(scale_out_records(lambda start_ms: encode_ipc_stream(
            batch(start_ms, seed=start_ms))))
        sent = [batch(T0 + i * 1_000, seed=T0 + i * 1_000) for i in range(3)] * 2
        got = got.with_columns(pl.lit(0.0).alias("price"))
        expected = reference(sent, WINDOW).with_columns(pl.lit(0.0).alias("price"))
    else:
        got = one_instance(config(TUMBLING, aggregation=AGGREGATION))
        expected = reference(BATCHES, WINDOW)
    assert got.schema["amount"] == pl.Decimal(38, 2)
    got = got.with_columns(pl.col("window_start").dt.epoch("ms"))
    assert_frame_equal(got.select(expected.columns), expected, check_row_order=False,
                       check_dtypes=False)


def test_early_revisions_and_sessions_add_up_to_the_same_exact_sums() -> None:
    early = one_instance(config(TUMBLING, aggregation=AGGREGATION,
                                input={"topics": ["in"], "max_groups": 2,
                                       "over_budget": "emit_early"}))
    summed = early.group_by("site").agg(pl.col("amount").sum(), pl.col("amount_max").max())
    expected = reference(BATCHES, "1 AS one").select("site", "amount", "amount_max")
    assert_frame_equal(summed, expected, check_row_order=False, check_dtypes=False)
    sessions = one_instance(config({"kind": "session", "gap_ms": 5_000},
                                   aggregation=AGGREGATION))
    assert_frame_equal(sessions.select(expected.columns), expected, check_row_order=False,
                       check_dtypes=False)
