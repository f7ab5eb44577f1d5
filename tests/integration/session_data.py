"""The session input the integration tests publish, and DuckDB's sessions of it: keys
spread over partitions, each running in blocks with pauses longer than the gap."""

from __future__ import annotations

import random
import zlib

import duckdb
import polars as pl
import pyarrow as pa

from tests.integration.data import KEYS, T0, sensor_table

GAP_MS = 100
SITES, SENSORS, ZONES = ["site-0", "site-1", "site-2"], ["ünï", 'b "q"', "c"], ["north", "south"]
ALL_KEYS = [(s, n, z) for s in SITES for n in SENSORS for z in ZONES]


def active(key: tuple[str, str, str], block: int) -> bool:
    """Whether ``key`` has rows in ``block``: two blocks in three, so some keys pause
    for a block (longer than the gap) and their sessions end, others run on."""
    return zlib.crc32(f"{key}/{block}".encode()) % 3 != 0


def keys_pausing_after(block: int) -> list[tuple[str, str, str]]:
    """The keys with rows in ``block`` and none in the next: their sessions end there."""
    return [k for k in ALL_KEYS if active(k, block) and not active(k, block + 1)]


def with_keys(table: pa.Table, keys: list[tuple[str, str, str]]) -> pa.Table:
    """``table`` with its rows' key columns set to ``keys``, row by row."""
    for i, name in enumerate(KEYS):
        table = table.set_column(table.schema.get_field_index(name), name,
                                 pa.array([k[i] for k in keys]))
    return table


def session_input(batches_per_producer: int, producers: int, span_ms: int,
                  ) -> list[tuple[int, pa.Table]]:
    """Each producer writes its own partition in event-time order; every key lives in
    every partition, in blocks of four batches (longer than the gap)."""
    rng = random.Random(17)
    out = []
    for batch in range(batches_per_producer):
        live = [k for k in ALL_KEYS if active(k, batch // 4)] or ALL_KEYS[:1]
        for producer in range(producers):
            table = sensor_table(rng, rng.randrange(20, 120), T0 + batch * span_ms, span_ms)
            out.append((producer, with_keys(table, [rng.choice(live)
                                                    for _ in range(table.num_rows)])))
    return out


# The default plan's aggregates of the sensor columns, in SQL.
SUMS = """SUM(reading_sum) AS reading_sum, SUM(reading_count)::BIGINT AS reading_count,
    MIN(reading_min) AS reading_min, MAX(reading_max) AS reading_max,
    SUM(power) AS power, SUM(error_count)::BIGINT AS error_count,
    MAX("δ_max") AS "δ_max"
"""


def session_reference(tables: list[pa.Table], gap_ms: int, aggregates: str = SUMS,
                      ) -> pl.DataFrame:
    """Sessions in DuckDB SQL: LAG over each key's rows in time order marks where the gap
    is reached, a running SUM numbers the sessions, GROUP BY aggregates them
    (``aggregates``: the plan's, in SQL)."""
    rows = pa.concat_tables(tables)  # noqa: F841 - read by DuckDB's replacement scan
    keys = ", ".join(f'"{k}"' for k in KEYS)
    sql = f"""
        WITH timed AS (SELECT *, epoch_ms(ts) AS t FROM rows),
        marked AS (
            SELECT *, CASE WHEN t - LAG(t) OVER (PARTITION BY {keys} ORDER BY t) < {gap_ms}
                      THEN 0 ELSE 1 END AS starts
            FROM timed),
        numbered AS (
            SELECT *, SUM(starts) OVER (PARTITION BY {keys} ORDER BY t, starts DESC
                                        ROWS UNBOUNDED PRECEDING) AS session
            FROM marked)
        SELECT MIN(t) AS window_start, MAX(t) + {gap_ms} AS window_end, {keys},
               {aggregates}, COUNT(*)::BIGINT AS row_count
        FROM numbered GROUP BY {keys}, session
    """  # noqa: S608 - only integers, the fixed key names and the tests' SQL are formatted in
    relation = duckdb.sql(sql)
    assert relation is not None
    return pl.DataFrame(relation.arrow()).sort(["window_start", *KEYS])


def sessions_of(frame: pl.DataFrame) -> pl.DataFrame:
    """Output rows with epoch-ms bounds, in the reference's order, without ``replaces``:
    no session of the tests using it went out early or was revised, so none names one."""
    if "replaces" in frame.columns:
        assert frame.get_column("replaces").list.len().sum() == 0, "a session replaced one"
        frame = frame.drop("replaces")
    return frame.with_columns(pl.col("window_end").dt.epoch("ms")).sort(
        ["window_start", *KEYS])


