"""Session windows with aggregates that do not decompose (median, quantile, n_unique,
expressions): each session's values are buffered, follow it through merges, and give
DuckDB's results over the session's rows, whatever the split into polls, partitions
and crashes; the memory budget counts them."""

from __future__ import annotations

import polars as pl
from hypothesis import given
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from consumer.core.types import PartitionKey
from tests.consumer.core.windows.helpers import P0, P1, Row, frame, ref
from tests.consumer.core.windows.session.harness import (
    HOLISTIC_PLAN,
    HOLISTIC_SQL,
    Message,
    MiniDaemon,
    emitted,
    feed,
    session_engine,
    session_reference,
)

# Three buffered columns: v_sum, n_count, v_max.
BUFFERED_COLUMNS = 3

rows_st = st.tuples(st.sampled_from(["a", "b", None]), st.integers(0, 3_000),
                    st.integers(-64, 64).map(lambda i: i / 4), st.integers(0, 3),
                    st.integers(-64, 64).map(lambda i: i / 2))
gaps = st.sampled_from([50, 100, 300])
maxima = st.sampled_from([None, 1_000])


def reference(rows: list[Row], gap_ms: int, max_session_ms: int | None = None,
              ) -> pl.DataFrame:
    return session_reference(rows, gap_ms, max_session_ms, HOLISTIC_SQL)


def row(k: str, ts: int, v: float, n: int = 1) -> Row:
    return (k, ts, v, n, v)


@given(messages=st.lists(st.tuples(st.sampled_from([P0, P1]),
                                   st.lists(rows_st, min_size=1, max_size=6)), max_size=10),
       gap_ms=gaps, max_session_ms=maxima)
def test_buffered_aggregates_of_sessions_merged_across_polls_equal_duckdb(
    messages: list[tuple[PartitionKey, list[Row]]], gap_ms: int, max_session_ms: int | None,
) -> None:
    engine = session_engine(gap_ms=gap_ms, max_session_ms=max_session_ms, plan=HOLISTIC_PLAN)
    engine.assign(P0, None, None, now_ms=0)
    engine.assign(P1, None, None, now_ms=0)
    offsets = {P0: 0, P1: 0}
    for partition, rows in messages:  # one poll each: sessions merge across polls
        feed(engine, partition, offsets[partition], rows, now_ms=1)
        offsets[partition] += 1
    every_row = [r for _, rows in messages for r in rows]
    assert engine.buffered_values() == len(every_row) * BUFFERED_COLUMNS
    closed = engine.close_due(10**9)  # all idle: every session closes
    assert_frame_equal(emitted(closed, HOLISTIC_SQL), reference(every_row, gap_ms, max_session_ms),
                       check_exact=False, rel_tol=1e-12)
    assert engine.buffered_values() == 0


def cut(rows: list[Row], sizes: list[int]) -> list[Message]:
    out, start = [], 0
    for size in sizes:
        out.append(rows[start:start + size])
        start += size
    return [m for m in [*out, rows[start:]] if m]


@given(rows0=st.lists(rows_st, max_size=14), rows1=st.lists(rows_st, max_size=14),
       sizes=st.lists(st.integers(1, 4), min_size=6, max_size=6),
       steps=st.lists(st.tuples(st.lists(st.sampled_from([P0, P1]), min_size=1, max_size=2),
                                st.sampled_from(["flush", "crash", "flush+crash"])),
                      max_size=10),
       gap_ms=gaps)
def test_crashes_anywhere_give_duckdbs_buffered_aggregates(
    *, rows0: list[Row], rows1: list[Row], sizes: list[int],
    steps: list[tuple[list[PartitionKey], str]], gap_ms: int,
) -> None:
    partitions = {P0: cut(sorted(rows0, key=lambda r: r[1]), sizes),
                  P1: cut(sorted(rows1, key=lambda r: r[1]), sizes[::-1])}
    daemon = MiniDaemon(partitions, gap_ms=gap_ms, plan=HOLISTIC_PLAN)
    for order, action in steps:
        daemon.poll(order)
        if "flush" in action:
            daemon.flush()
        if "crash" in action:
            daemon.crash()
    output = daemon.finish()
    assert_frame_equal(emitted(output.windows, HOLISTIC_SQL), reference([*rows0, *rows1], gap_ms),
                       check_exact=False, rel_tol=1e-12)
    assert output.late == []


def test_an_early_revision_takes_its_values_out_and_the_next_covers_only_its_own() -> None:
    engine = session_engine(gap_ms=100, plan=HOLISTIC_PLAN)
    engine.assign(P0, None, None, now_ms=0)
    first = [row("a", 0, 1.0), row("a", 50, 3.0), row("a", 60, 8.0)]
    feed(engine, P0, 0, first, now_ms=1)
    assert engine.buffered_values() == 3 * BUFFERED_COLUMNS
    (early,) = engine.emit_early(now_ms=1)
    assert engine.buffered_values() == 0  # the budget got its memory back
    second = [row("a", 120, 10.0), row("a", 150, 20.0)]
    feed(engine, P0, 1, second, now_ms=2)
    (last,) = engine.close_due(10**9)
    assert (early.final, early.kind, last.final, last.kind) == (False, "delta", True, "delta")
    # Each revision's median is over its own rows, under the session's window_start.
    assert_frame_equal(early.frame, reference(first, 100))
    assert_frame_equal(last.frame.drop("window_start"),
                       reference(second, 100).drop("window_start"))
    assert last.frame["window_start"].to_list() == early.frame["window_start"].to_list()


def test_values_of_late_rows_and_of_discarded_sessions_are_not_kept() -> None:
    engine = session_engine(gap_ms=100, plan=HOLISTIC_PLAN)
    engine.assign(P0, None, None, now_ms=0)
    feed(engine, P0, 0, [row("a", 0, 1.0), row("b", 1_000, 2.0)], now_ms=1)
    assert len(engine.close_due(now_ms=1)) == 1  # a's session, below the watermark 1000
    late = engine.add(frame([row("a", 10, 5.0)]), [ref(P0, 1, [row("a", 10, 5.0)])], 2)
    assert late is not None
    assert late.height == 1
    assert engine.buffered_values() == BUFFERED_COLUMNS  # b's row only
    engine.discard()
    assert engine.buffered_values() == 0
