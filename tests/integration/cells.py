"""The scale-out cells' plans, inputs and readers, shared by the matrix
(test_scale_out_matrix.py) and the rebalance storm (test_rebalance_storm.py): a plan mixing
aggregates that merge with ones that need the window's values, the late policies, the
session cells' input (rows far behind, just behind, behind sessions already out), and
what a subscriber holds once every revision is applied."""

from __future__ import annotations

import random
from typing import Any

import polars as pl
import pyarrow as pa

from consumer.kafka.tail import read_output
from tests.integration.data import KEYS, T0, sensor_table
from tests.integration.faults import read_topic
from tests.integration.instances import INPUT_PARTITIONS, SIZE_MS, STEP_MS, WORKERS
from tests.integration.session_data import (
    ALL_KEYS,
    SUMS,
    keys_pausing_after,
    session_input,
    with_keys,
)
from wire.input import decode_ipc_stream

REVISION_LATENESS_MS = 3 * SIZE_MS
AGGREGATION = {
    "columns": {"power": "median", "δ_max": {"quantile": 0.9}, "error_count": "n_unique",
                "row_id": "count"},
    "expressions": {"positive": "pl.col('reading_sum').filter(pl.col('reading_sum') > 0)"
                                ".sum()"},
}
LATE: dict[str, dict[str, Any]] = {
    "topic": {}, "revise": {"late": "revise", "revision_lateness_ms": REVISION_LATENESS_MS}}


def numbered(table: pa.Table, first_id: int) -> pa.Table:
    """The batch with a ``row_id`` column (counted by the plan), so that the rows the
    daemon sent to the late topic can be told apart."""
    return table.append_column("row_id", pa.array(range(first_id, first_id + table.num_rows),
                                                  pa.int64()))



def late_pairs(bootstrap: str, topic: str) -> pl.DataFrame:
    """(row_id, window_start) of every row the daemon sent to the late topic."""
    records = read_topic(bootstrap, topic, 1, quiet_s=1.0)
    assert all(r.headers.get("arrowagg.late.kind") != b"aggregate" for r in records), \
        "no stage-2 late aggregates in this input (no input partition goes idle)"
    frames = [pl.DataFrame(decode_ipc_stream(r.value)).select(
        "row_id", pl.lit(int(r.headers["arrowagg.window-start"])).alias("window_start"))
        for r in records]
    return pl.concat(frames) if frames else pl.DataFrame(
        schema={"row_id": pl.Int64, "window_start": pl.Int64})



# -- session cells ---------------------------------------------------------------------

GAP_MS = 100
SESSION_STEPS = 90
SESSION_SECTIONS: dict[str, dict[str, Any]] = {
    "window": {"kind": "session", "size_ms": None, "gap_ms": GAP_MS, "late": "topic",
               "allowed_lateness_ms": SIZE_MS},
    "aggregation": {"columns": {"row_id": "count", "power": "mean"}},
}
SESSION_AGGREGATES = SUMS.replace("SUM(power) AS power", "AVG(power) AS power") + \
    ", COUNT(row_id)::BIGINT AS row_id"
# The time cells' aggregates that need every row of a session (AGGREGATION), in DuckDB
# SQL: quantile_cont is Polars' linear interpolation; a sum over no rows is Polars' 0.
HOLISTIC_SESSION_AGGREGATES = """median(power) AS power,
    quantile_cont("δ_max", 0.9) AS "δ_max",
    count(DISTINCT error_count)::BIGINT AS error_count, COUNT(row_id)::BIGINT AS row_id,
    COALESCE(SUM(reading_sum) FILTER (WHERE reading_sum > 0), 0) AS positive"""
SESSION_PLANS = {
    "merging": (SESSION_SECTIONS, SESSION_AGGREGATES),
    "holistic": ({**SESSION_SECTIONS, "aggregation": AGGREGATION}, HOLISTIC_SESSION_AGGREGATES),
}
FAR_BACK_MS = 6 * SIZE_MS  # beyond allowed lateness, the gap, revision lateness: late
NEAR_BACK_MS = SIZE_MS // 2  # within allowed lateness: merged
MID_BACK_MS = 2 * SIZE_MS  # beyond allowed lateness, within revision lateness: revises


def session_cell_input(rng: random.Random, *, revise: bool,
                       ) -> tuple[list[tuple[int, pa.Table]], set[int]]:
    """Workers write their partitions in event-time order, every key in every partition,
    keys pausing longer than the gap now and then (tests/integration/session_data.py);
    every 10th step one also sends rows far behind (late) or just behind (not late), and
    with ``revise`` (every 5th step) rows behind sessions that went out, to revise them.
    Returns the batches and the row_ids sent far behind."""
    batches, far, next_id = [], set(), 0
    steps = session_input(SESSION_STEPS, WORKERS, STEP_MS)
    for index, (worker, table) in enumerate(steps):
        batches.append((worker % INPUT_PARTITIONS, numbered(table, next_id)))
        next_id += table.num_rows
        step = index // WORKERS
        if revise and worker == 0 and step >= 40 and step % 10 == 5:
            # Keys whose session ended in that block (they pause in the next): it went out.
            at = step * STEP_MS - MID_BACK_MS
            ending = keys_pausing_after(at // STEP_MS // 4) or ALL_KEYS
            behind = sensor_table(rng, 10, T0 + at, STEP_MS)
            behind = numbered(with_keys(behind, [rng.choice(ending) for _ in range(10)]),
                              next_id)
            next_id += behind.num_rows
            batches.append((rng.randrange(INPUT_PARTITIONS), behind))
        if worker == 0 and step >= 40 and step % 10 == 0:
            back = rng.choice([FAR_BACK_MS, NEAR_BACK_MS])
            behind = numbered(sensor_table(rng, 10, T0 + step * STEP_MS - back, STEP_MS),
                              next_id)
            if back == FAR_BACK_MS:
                far |= set(range(next_id, next_id + behind.num_rows))
            next_id += behind.num_rows
            batches.append((rng.randrange(INPUT_PARTITIONS), behind))
    return batches, far



def after_the_end(rows: pa.Table, first_id: int) -> pa.Table:
    """Rows 800 ms behind the last, of keys whose session ended there: within the
    revision lateness of every watermark, and of sessions that went out (kept)."""
    last = int(pl.DataFrame(rows).select(pl.col("ts").dt.epoch("ms").max()).item()) - T0
    at = last - MID_BACK_MS
    ending = keys_pausing_after(at // STEP_MS // 4) or ALL_KEYS
    rng = random.Random(36)
    table = with_keys(sensor_table(rng, 10, T0 + at, STEP_MS),
                      [rng.choice(ending) for _ in range(10)])
    return numbered(table, first_id)


def held_rows(bootstrap: str, topic: str) -> int:
    """The input rows of every session a subscriber holds (``held_sessions``)."""
    return int(held_sessions(bootstrap, topic)[0].get_column("row_count").sum())


def held_sessions(bootstrap: str, topic: str) -> tuple[pl.DataFrame, int]:
    """What a subscriber holds once it applied every whole batch of every part in order
    (read_output(complete=True) says which held rows each revision replaced), with
    epoch-ms bounds; and how many rows replaced emitted sessions."""
    held: pl.DataFrame | None = None
    on = ["window_start", *KEYS]
    updates = 0
    for whole in read_output(bootstrap, topic, idle_timeout_s=3.0, complete=True):
        assert whole.replaced is not None
        if held is not None and whole.replaced.height:
            held = held.join(whole.replaced.select(on), on=on, how="anti", nulls_equal=True)
        if "replaces" in whole.frame.columns:
            updates += whole.frame.filter(pl.col("replaces").list.len() > 0).height
        held = whole.frame if held is None else pl.concat([held, whole.frame],
                                                          how="diagonal_relaxed")
    assert held is not None
    return held.drop("revision", "replaces", strict=False).with_columns(
        pl.col("window_start", "window_end").dt.epoch("ms"), pl.col(KEYS).cast(pl.String),
    ), updates
