"""Early results (window.emit_every_ms): an open window's changed groups go out as
provisional revisions with their whole current values, the window unchanged; its closing
revision, numbered after them, is the whole window (full), or a delta after a budget's
early revision took rows out of it."""

from __future__ import annotations

import polars as pl
from polars.testing import assert_frame_equal

from consumer.core.windows.revisions import RevisionNumbers
from tests.consumer.core.windows.helpers import (
    P0,
    Row,
    at,
    check_windows,
    count_engine,
    feed,
    reference,
    time_engine,
)

FIRST: list[Row] = [("a", 100, 1.0, 1, 5.0), ("b", 200, 2.0, 1, 6.0)]
SECOND: list[Row] = [("a", 300, 4.0, 2, 9.0)]
CLOSER: list[Row] = [("c", 1_500, 8.0, 1, 1.0)]


def only(rows: list[Row], keys: set[str]) -> pl.DataFrame:
    return reference(rows)[0].filter(pl.col("k").is_in(sorted(keys)))


def test_a_time_window_tells_its_changed_groups_as_of_now_and_closes_whole() -> None:
    engine = time_engine(provisional=True)
    engine.assign(P0, None, None, now_ms=0)
    feed(engine, P0, 0, FIRST, now_ms=10)
    [first] = engine.provisional(now_ms=11)
    assert (first.start_ms, first.final, first.revision, first.kind) == (0, False, 0, "update")
    assert_frame_equal(first.frame.sort("k"), only(FIRST, {"a", "b"}))
    feed(engine, P0, 1, SECOND, now_ms=20)
    [second] = engine.provisional(now_ms=21)  # only a changed: its whole value
    assert (second.revision, second.kind) == (1, "update")
    assert_frame_equal(second.frame, only(FIRST + SECOND, {"a"}))
    assert engine.provisional(now_ms=22) == []  # nothing changed since
    assert engine.cardinality() == 2  # the window is as it was
    feed(engine, P0, 2, CLOSER, now_ms=30)
    [closed] = engine.close_due(now_ms=30)
    assert (closed.final, closed.revision, closed.kind) == (True, 2, "full")
    check_windows([closed], {0: reference(FIRST + SECOND)[0]})


def test_a_count_window_tells_its_changed_groups_ending_now() -> None:
    engine = count_engine(batches=3, provisional=True)
    engine.assign(P0, None, None, now_ms=0)
    feed(engine, P0, 0, at(FIRST, 0), now_ms=100)
    [early] = engine.provisional(now_ms=150)
    assert (early.start_ms, early.end_ms, early.final, early.kind) == (100, 150, False,
                                                                       "update")
    assert early.frame["k"].sort().to_list() == ["a", "b"]
    feed(engine, P0, 1, at(SECOND, 0), now_ms=200)
    [later] = engine.provisional(now_ms=250)
    assert later.frame["k"].to_list() == ["a"]
    assert later.frame["v_sum"].to_list() == [5.0]
    feed(engine, P0, 2, at(CLOSER, 0), now_ms=300)
    [closed] = engine.close_due(now_ms=300)
    assert (closed.start_ms, closed.final, closed.revision, closed.kind) == (100, True, 2,
                                                                             "full")
    assert closed.frame["k"].sort().to_list() == ["a", "b", "c"]


def test_the_closing_revision_is_a_delta_only_after_an_early_one_emptied_the_window() -> None:
    engine = time_engine(provisional=True)
    engine.assign(P0, None, None, now_ms=0)
    feed(engine, P0, 0, FIRST, now_ms=10)
    [provisional] = engine.provisional(now_ms=11)
    [early] = engine.emit_early(now_ms=12)  # the memory budget
    assert (provisional.revision, early.revision, early.kind) == (0, 1, "delta")
    feed(engine, P0, 1, SECOND, now_ms=20)
    feed(engine, P0, 2, CLOSER, now_ms=30)
    [closed] = engine.close_due(now_ms=30)
    assert (closed.revision, closed.kind) == (2, "delta")
    check_windows([closed], {0: reference(SECOND)[0]})


def test_numbers_go_on_per_window() -> None:
    numbers = RevisionNumbers()
    engine = time_engine(provisional=True)
    engine.assign(P0, None, None, now_ms=0)
    feed(engine, P0, 0, [*FIRST, ("a", 1_100, 1.0, 1, 1.0)], now_ms=10)
    windows = engine.provisional(now_ms=11)
    assert [(w.start_ms, w.revision) for w in windows] == [(0, 0), (1_000, 0)]
    assert [w.revision for w in numbers.provisional(windows)] == [0, 0]
    assert [w.revision for w in numbers.provisional(windows)] == [1, 1]
    assert [(w.revision, w.kind) for w in numbers.closing(windows)] == [(2, "full"),
                                                                         (2, "full")]
