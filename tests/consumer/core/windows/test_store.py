"""WindowStore against DuckDB: closing some windows, merging on a cadence, skipped grouping."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import duckdb
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from consumer.core import keys
from consumer.core.aggregate import PartialAggregator
from consumer.core.plan import derive_plan
from consumer.core.types import ClosedWindow
from consumer.core.windows.store import WindowStore

WINDOW_MS = 10
SCHEMA = pa.schema([("k", pa.string()), ("j", pa.string()), ("v_sum", pa.float64()),
                    ("n_count", pa.int64()), ("v_min", pa.int64())])
PLAN = derive_plan(SCHEMA)
GROUP_BY = ("window_start", "k", "j")
REFERENCE_SQL = """
SELECT window_start, k, j, SUM(v_sum) AS v_sum, CAST(SUM(n_count) AS BIGINT) AS n_count,
       MIN(v_min) AS v_min, COUNT(*) AS row_count
FROM rows GROUP BY ALL
"""


def rows(count: int, *, seed: int, keys: int, windows: int, nulls: bool) -> pl.DataFrame:
    pick = (pl.int_range(0, count, dtype=pl.Int64) * 7919 + seed * 104_729) % 1_000_003
    missing = (pick % 11 == 0) if nulls else pl.lit(value=False)
    return pl.select(
        window_start=pick % windows * WINDOW_MS,
        k=pl.when(pick % 13 == 0).then(None).otherwise(pl.format("k{}", pick % keys)),
        j=pl.format("j{}", pick % 3),
        v_sum=pl.when(missing).then(None).otherwise(pick.cast(pl.Float64) / 8),
        n_count=pl.when(missing).then(None).otherwise(pick % 5),
        v_min=pick % 97,
    )


def reference(frame: pl.DataFrame) -> pl.DataFrame:
    with duckdb.connect() as con:
        con.register("rows", frame.to_arrow())
        result: pl.DataFrame = con.sql(REFERENCE_SQL).pl()
    return result


def emitted(windows: Sequence[ClosedWindow]) -> pl.DataFrame:
    frames = [w.frame.with_columns(pl.col("window_start").dt.epoch("ms")).drop("window_end")
              for w in windows]
    return pl.concat(frames).with_columns(pl.col("k", "j").cast(pl.String))


def assert_same(got: pl.DataFrame, expected: pl.DataFrame) -> None:
    order = [*GROUP_BY]
    assert_frame_equal(got.sort(order, nulls_last=True), expected.sort(order, nulls_last=True),
                       rel_tol=1e-9, abs_tol=1e-9)


def feed(store: WindowStore, aggregator: PartialAggregator, batch: pl.DataFrame) -> None:
    partial = aggregator.partial(batch.lazy())
    starts = partial.get_column("window_start").unique().to_list()
    store.add(partial, {s: s + WINDOW_MS for s in starts})


@given(
    cuts=st.lists(st.integers(0, 3_000), max_size=6),
    closes=st.lists(st.integers(0, 5), max_size=6),
    merge_every=st.integers(1, 4),
    categorical=st.booleans(),
)
def test_closing_in_any_order_of_batches_and_closes_equals_sql(
    cuts: list[int], closes: list[int], merge_every: int, categorical: bool
) -> None:
    # In window order, as the engine's watermark sees them: a window closes only after
    # its last row (later rows of a closed window are the engine's late rows).
    frame = rows(3_000, seed=1, keys=40, windows=6, nulls=True).sort("window_start",
                                                                      maintain_order=True)
    if categorical:  # dictionary input: keys arrive as categoricals
        frame = frame.with_columns(pl.col("k", "j").cast(pl.Categorical))
    aggregator = PartialAggregator(PLAN, GROUP_BY)
    store = WindowStore(aggregator, merge_every=merge_every)
    bounds = [0, *sorted(cuts), frame.height]
    out: list[ClosedWindow] = []
    for index, (lo, hi) in enumerate(pairwise(bounds)):
        feed(store, aggregator, frame.slice(lo, hi - lo))
        if index < len(closes) and hi < frame.height:  # close some complete windows
            complete_through = frame.item(hi, "window_start")
            out += store.pop_closed(min(closes[index] * WINDOW_MS, complete_through))
    out += store.pop_all()
    assert store.cardinality() == 0
    assert len({w.start_ms for w in out}) == len(out)  # each window emitted once
    assert_same(emitted(out), reference(frame.with_columns(pl.col("k", "j").cast(pl.String))))


def test_a_window_of_one_ungrouped_batch_is_still_grouped() -> None:
    """After a batch of nearly distinct groups, the next batches pass ungrouped; a window
    that holds only such a batch must still come out with one row per group."""
    aggregator = PartialAggregator(PLAN, GROUP_BY)
    store = WindowStore(aggregator, merge_every=8)
    distinct = rows(60_000, seed=2, keys=1_000_000, windows=1, nulls=False)
    feed(store, aggregator, distinct)
    first = store.pop_all()
    repeated = rows(30_000, seed=3, keys=500, windows=1, nulls=True).with_columns(
        window_start=pl.lit(WINDOW_MS, pl.Int64))
    feed(store, aggregator, repeated)
    assert not aggregator.last_partial_grouped
    second = store.pop_all()
    assert_same(emitted(first), reference(distinct))
    assert_same(emitted(second), reference(repeated))


@pytest.mark.parametrize("nulls", [False, True])
def test_counts_taken_from_row_counts_in_a_big_merge_match_sql(nulls: bool) -> None:
    """Big merges skip re-summing non-null counts that equal the row count; a batch with
    nulls in between must still be counted right."""
    aggregator = PartialAggregator(PLAN, GROUP_BY)
    batches = [rows(40_000, seed=s, keys=20_000, windows=2, nulls=nulls and s == 1)
               for s in range(3)]
    states = [aggregator.partial(b.lazy()) for b in batches]
    got = aggregator.finalize(aggregator.merge(states))
    expected = reference(pl.concat(batches))
    assert_same(got.with_columns(pl.col("k", "j").cast(pl.String)), expected)


def test_string_keys_renewed_while_windows_stay_open_match_sql(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Key values churn from window to window: the store renews the state's key ids at
    closes (forced here at every close) while a window stays open across them, and the
    pending partials, the state and later batches still merge by the same keys."""
    monkeypatch.setattr(keys, "_RENEW_FROM_IDS", 0)
    monkeypatch.setattr(keys, "_RENEW_PER_LIVE_ROW", 0)
    renewals: list[int] = []
    renew = keys.StateKeys.renew

    def counted(self: keys.StateKeys, states: Sequence[pl.DataFrame]) -> list[pl.DataFrame]:
        renewals.append(len(states))
        return renew(self, states)

    monkeypatch.setattr(keys.StateKeys, "renew", counted)
    aggregator = PartialAggregator(PLAN, GROUP_BY)
    store = WindowStore(aggregator, merge_every=3)
    batches = [rows(2_000, seed=s, keys=50, windows=3, nulls=s % 2 == 0).with_columns(
        window_start=pl.col("window_start") + s // 2 * WINDOW_MS,
        k=pl.format("{}-{}", pl.col("k"), pl.lit(s // 3)))  # new key values every 3 batches
        for s in range(12)]
    out: list[ClosedWindow] = []
    for index, batch in enumerate(batches):
        feed(store, aggregator, batch)
        out += store.pop_closed(index // 2 * WINDOW_MS)  # windows before this batch's
    out += store.pop_all()
    assert max(renewals) >= 2  # some renewals had the state and pending partials to move
    assert len({w.start_ms for w in out}) == len(out)
    assert_same(emitted(out), reference(pl.concat(batches)))
