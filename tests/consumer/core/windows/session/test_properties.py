"""Properties of session windows, against the DuckDB sort-and-scan reference:

- any split of the rows into messages, polls and partitions gives the same sessions;
- any crash points (SIGKILL-like: the uncommitted is lost, the engine restarts from the
  committed offsets and their metadata) give the same committed output as no crash,
  when each partition is in time order;
- with rows in any order, early revisions and crashes anywhere, no row is duplicated or
  lost (each is in exactly one committed session or in the late output), and a
  subscriber applying the committed output as docs/wire-format.md says (written from
  the text here, and wire.sessions.SessionTable) holds the sort-and-scan sessions of the
  rows not late.
"""

from __future__ import annotations

import polars as pl
from hypothesis import example, given
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from consumer.core.types import PartitionKey
from tests.consumer.core.windows.helpers import P0, P1, Row, frame, ref
from tests.consumer.core.windows.session.harness import (
    Message,
    MiniDaemon,
    Output,
    emitted,
    feed,
    held_sessions,
    not_late,
    session_engine,
    session_reference,
    table_sessions,
)

rows_st = st.tuples(st.sampled_from(["a", "b", None]), st.integers(0, 3_000),
                    st.integers(-64, 64).map(lambda i: i / 4), st.integers(-100, 100),
                    st.integers(-64, 64).map(lambda i: i / 2))
gaps = st.sampled_from([50, 100, 300])
maxima = st.sampled_from([None, 400, 1_000])


@given(messages=st.lists(st.tuples(st.sampled_from([P0, P1]), st.lists(rows_st, min_size=1,
                                                                       max_size=6)),
                         max_size=10),
       poll_sizes=st.lists(st.integers(1, 4), min_size=10, max_size=10),
       gap_ms=gaps, max_session_ms=maxima)
def test_any_split_into_polls_and_partitions_gives_the_sort_and_scan_sessions(
    messages: list[tuple[PartitionKey, list[Row]]], poll_sizes: list[int], gap_ms: int,
    max_session_ms: int | None,
) -> None:
    engine = session_engine(gap_ms=gap_ms, max_session_ms=max_session_ms)
    engine.assign(P0, None, None, now_ms=0)
    engine.assign(P1, None, None, now_ms=0)
    offsets = {P0: 0, P1: 0}
    start = 0
    for size in poll_sizes:
        poll = messages[start:start + size]
        start += size
        if not poll:
            break
        refs = []
        for partition, rows in poll:
            refs.append(ref(partition, offsets[partition], rows))
            offsets[partition] += 1
        assert engine.add(frame([r for _, rows in poll for r in rows]), refs, now_ms=1) is None
    for partition, rows in messages[start:]:
        feed(engine, partition, offsets[partition], rows, now_ms=1)
        offsets[partition] += 1
    closed = engine.close_due(10**9)  # all idle: every session closes
    every_row = [r for _, rows in messages for r in rows]
    assert_frame_equal(emitted(closed), session_reference(every_row, gap_ms, max_session_ms))
    assert engine.late_rows == 0


# -- crashes -----------------------------------------------------------------------------

steps_st = st.lists(st.tuples(st.lists(st.sampled_from([P0, P1]), min_size=1, max_size=3),
                              st.sampled_from(["flush", "flush", "crash", "flush+crash"])),
                    max_size=14)
# ... and early revisions (the memory budget), which keep only the open sessions' bounds.
steps_with_early_st = st.lists(
    st.tuples(st.lists(st.sampled_from([P0, P1]), min_size=1, max_size=3),
              st.sampled_from(["flush", "flush", "crash", "flush+crash", "flush+early",
                               "flush+early+crash"])),
    max_size=14)


def cut(rows: list[Row], cuts: list[int]) -> list[Message]:
    """``rows`` as consecutive messages of the given sizes (the rest in a last one)."""
    out, start = [], 0
    for size in cuts:
        if start >= len(rows):
            break
        out.append(rows[start:start + size])
        start += size
    if start < len(rows):
        out.append(rows[start:])
    return out


def run(partitions: dict[PartitionKey, list[Message]],
        steps: list[tuple[list[PartitionKey], str]], gap_ms: int,
        max_session_ms: int | None) -> Output:
    """Take ``steps`` (poll these partitions, then flush, emit early, crash), then the
    rest of the input; return the committed output."""
    daemon = MiniDaemon(partitions, gap_ms=gap_ms, max_session_ms=max_session_ms)
    for order, action in steps:
        daemon.poll(order)
        if "flush" in action:
            daemon.flush(early="early" in action)
        if "crash" in action:
            daemon.crash()
    return daemon.finish()


@given(rows0=st.lists(rows_st, max_size=14), rows1=st.lists(rows_st, max_size=14),
       cuts=st.lists(st.integers(0, 4), min_size=8, max_size=8), steps=steps_st,
       gap_ms=gaps, max_session_ms=maxima)
def test_crashes_anywhere_give_the_output_of_no_crash_when_partitions_are_in_order(
    *, rows0: list[Row], rows1: list[Row], cuts: list[int],
    steps: list[tuple[list[PartitionKey], str]], gap_ms: int, max_session_ms: int | None,
) -> None:
    partitions = {P0: cut(sorted(rows0, key=lambda r: r[1]), cuts),
                  P1: cut(sorted(rows1, key=lambda r: r[1]), cuts[::-1])}
    crashed = run(partitions, steps, gap_ms, max_session_ms)
    calm = run(partitions, [(order, "flush") for order, _ in steps], gap_ms, max_session_ms)
    expected = session_reference([*rows0, *rows1], gap_ms, max_session_ms)
    assert_frame_equal(emitted(crashed.windows), expected)
    assert_frame_equal(emitted(calm.windows), expected)
    assert crashed.late == []


def per_key(rows: pl.DataFrame, count: pl.Expr) -> pl.DataFrame:
    return rows.group_by("k").agg(count.cast(pl.Int64).alias("rows"),
                                  pl.col("n_count").sum().alias("n"))


@given(rows0=st.lists(rows_st, max_size=14), rows1=st.lists(rows_st, max_size=14),
       cuts=st.lists(st.integers(0, 4), min_size=8, max_size=8), steps=steps_with_early_st,
       gap_ms=gaps, max_session_ms=maxima)
# An early revision, a crash, a row of the same keys and start, another early revision:
# the second delta must not repeat the first one's revision.
@example(rows0=[("a", 1, 0.0, 0, 0.0)] * 2, rows1=[], cuts=[1] * 8,
         steps=[([P0], "flush+early+crash"), ([P0], "flush+early")], gap_ms=50,
         max_session_ms=None)
# A row before an early-emitted session's first moves its start: the closing delta has
# another window_start, and its window overlaps the first delta's.
@example(rows0=[], rows1=[("a", 1, 0.0, 0, 0.0)] + [("a", 0, 0.0, 0, 0.0)] * 3,
         cuts=[0] * 7 + [1], steps=[([P1], "flush+early")], gap_ms=50, max_session_ms=None)
# ... and after a restart, which does not know the emptied session, the rows at 0 go out
# as a session of their own: its window overlaps the delta's, so they are one.
@example(rows0=[], rows1=[("a", 1, 0.0, 0, 0.0)] + [("a", 0, 0.0, 0, 0.0)] * 3,
         cuts=[0] * 7 + [1], steps=[([P1], "flush+early+crash")], gap_ms=50,
         max_session_ms=None)
# The early revision let b [0, 300)'s rows go (closed less than a gap before the
# frontier); after the restart b@1, late for the running engine, goes out as b [1, 301).
@example(rows0=[("a", 300, 0.0, 0, 0.0)],
         rows1=[("a", 0, 0.0, 0, 0.0)] * 2 + [("a", 300, 0.0, 0, 0.0), ("b", 0, 0.0, 0, 0.0)]
         + [("a", 0, 0.0, 0, 0.0)] * 5 + [("b", 1, 0.0, 0, 0.0)],
         cuts=[0, 1, 0, 0, 0, 0, 0, 4], steps=[([P0, P0, P1], "flush+early+crash")],
         gap_ms=300, max_session_ms=None)
def test_crashes_with_rows_in_any_order_lose_nothing_and_subscribers_hold_the_sessions(
    *, rows0: list[Row], rows1: list[Row], cuts: list[int],
    steps: list[tuple[list[PartitionKey], str]], gap_ms: int, max_session_ms: int | None,
) -> None:
    output = run({P0: cut(rows0, cuts), P1: cut(rows1, cuts[::-1])}, steps, gap_ms,
                 max_session_ms)
    # Each row is in exactly one committed session or in the late output.
    parts = [per_key(emitted(output.windows), pl.col("row_count").sum())]
    parts += [per_key(late.select("k", "n_count"), pl.len()) for late in output.late]
    counted = pl.concat(parts).group_by("k").agg(pl.col("rows", "n").sum()).sort(
        "k", nulls_last=True)
    expected = per_key(frame([*rows0, *rows1]), pl.len()).sort("k", nulls_last=True)
    assert_frame_equal(counted, expected)
    # A session's final result is emitted once, and no row repeats another's keys, start,
    # revision and kind: subscribers skip such a row as a repeat (docs/wire-format.md).
    finals = emitted([w for w in output.windows if w.final]).select("k", "window_start")
    assert finals.height == finals.unique().height
    named = pl.concat([w.frame.select("k", "window_start").with_columns(
        pl.lit(w.revision).alias("revision"), pl.lit(w.kind).alias("kind"))
        for w in output.windows] or [pl.DataFrame()])
    assert named.height == named.unique().height
    # A subscriber, as the docs say and as SessionTable does, holds the sort-and-scan
    # sessions of the rows not late.
    sessions = session_reference(not_late([*rows0, *rows1], output.late), gap_ms,
                                 max_session_ms)
    assert_frame_equal(held_sessions(output.windows), sessions)
    assert_frame_equal(table_sessions(output.windows), sessions)



def test_rows_joining_a_session_a_restart_forgot_are_one_session_with_its_deltas() -> None:
    # The restart does not know a@1's session, which the early revision emptied, so the
    # rows at 0 that join it go out as a session [0, 50) of their own, whole; its window
    # overlaps the delta's [1, 51), so a subscriber holds one session (wire-format.md).
    rows1 = [("a", 1, 1.0, 1, 1.0)] + [("a", 0, 2.0, 1, 2.0)] * 3
    output = run({P0: [], P1: cut(rows1, [1])}, [([P1], "flush+early+crash")], 50, None)
    assert [(w.kind, w.frame.get_column("row_count").to_list()) for w in output.windows] == [
        ("delta", [1]), ("full", [3])]
    assert_frame_equal(held_sessions(output.windows), session_reference(rows1, 50))
