"""Count windows: every N messages or M rows, idleness, restarts, the memory budget."""

from __future__ import annotations

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from consumer.core.offsets import CommitMetadata, CommitPoint
from tests.consumer.core.windows.helpers import (
    P0,
    P1,
    RESULT_SCHEMA,
    UTC_MS,
    Row,
    at,
    commit_points,
    count_engine,
    feed,
    frame,
    ref,
    reference,
)


def numbered(count: int, start: int = 0) -> list[Row]:
    return [("a" if i % 2 else "b", 0, float(start + i), 1, float(start + i))
            for i in range(count)]


def test_count_window_closes_after_n_batches() -> None:
    engine = count_engine(batches=2)
    engine.assign(P0, None, None, now_ms=0)
    sizes = [3, 1, 2, 4, 5]
    messages = [numbered(n, start=10 * i) for i, n in enumerate(sizes)]
    for offset, rows in enumerate(messages[:4]):
        feed(engine, P0, offset, rows, now_ms=100 * (offset + 1))
    closed = engine.close_due(450)
    assert [w.input_rows for w in closed] == [4, 6]
    assert [(w.start_ms, w.end_ms) for w in closed] == [(100, 200), (300, 400)]
    expected_first = reference(at(messages[0] + messages[1], 0))[0]
    assert_frame_equal(
        closed[0].frame.sort("k").drop("window_start", "window_end"),
        expected_first.drop("window_start", "window_end"),
    )
    bounds = closed[1].frame.select("window_start", "window_end").unique()
    assert bounds.rows() == [(
        pl.Series([300]).cast(UTC_MS)[0], pl.Series([400]).cast(UTC_MS)[0])]
    assert closed[1].frame.schema == pl.Schema(RESULT_SCHEMA)
    feed(engine, P0, 4, messages[4], now_ms=500)
    assert engine.close_due(501) == []
    assert engine.open_window_count() == 1


def test_count_window_closes_after_m_rows_without_splitting_messages() -> None:
    engine = count_engine(rows=5)
    engine.assign(P0, None, None, now_ms=0)
    sizes = [3, 1, 2, 4, 7, 1]
    frames = [numbered(n, start=100 * i) for i, n in enumerate(sizes)]
    refs = [ref(P0, offset, rows) for offset, rows in enumerate(frames)]
    # All six messages arrive in one poll: one add() with one frame.
    engine.add(frame([row for rows in frames for row in rows]), refs, now_ms=1_000)
    closed = engine.close_due(1_000)
    assert [w.input_rows for w in closed] == [3 + 1 + 2, 4 + 7]
    assert engine.open_window_count() == 1
    tail = engine.close_due(10**9)  # idle
    assert [w.input_rows for w in tail] == [1]
    windows = [*closed, *tail]
    total = pl.concat([w.frame for w in windows])
    assert int(total["row_count"].sum()) == sum(sizes)
    assert total["v_sum"].sum() == sum(r[2] for rows in frames for r in rows)
    assert total["v_max"].max() == max(r[4] for rows in frames for r in rows)


def test_count_window_idle_close() -> None:
    engine = count_engine(batches=100, idle_timeout_ms=1_000)
    engine.assign(P0, None, None, now_ms=0)
    feed(engine, P0, 0, numbered(3), now_ms=500)
    feed(engine, P0, 1, numbered(2), now_ms=800)
    assert engine.close_due(1_799) == []
    (window,) = engine.close_due(1_800)
    assert (window.start_ms, window.end_ms, window.input_rows) == (500, 1_800, 5)
    assert engine.open_window_count() == 0
    assert engine.close_due(10**9) == []


def test_count_window_commit_points() -> None:
    engine = count_engine(batches=2)
    engine.assign(P0, None, None, now_ms=0)
    engine.assign(P1, 20, None, now_ms=0)
    feed(engine, P0, 0, numbered(1), now_ms=1)
    feed(engine, P1, 20, numbered(1), now_ms=2)  # window 0 full
    feed(engine, P0, 1, numbered(1), now_ms=3)
    # Window 0 is closed but not handed out yet: nothing is committable.
    assert commit_points(engine) == {
        P0: CommitPoint(0, CommitMetadata(frontier=None, position=2, max_event_ms=None)),
        P1: CommitPoint(20, CommitMetadata(frontier=None, position=21, max_event_ms=None)),
    }
    assert len(engine.close_due(4)) == 1
    assert commit_points(engine) == {
        P0: CommitPoint(1, CommitMetadata(frontier=0, position=2, max_event_ms=None)),
        P1: CommitPoint(21, CommitMetadata(frontier=0, position=21, max_event_ms=None)),
    }
    engine.skip(P1, 21, now_ms=5)
    assert commit_points(engine)[P1].offset == 22


def test_count_window_assign_restores_the_window_number() -> None:
    engine = count_engine(batches=1)
    engine.assign(P0, 7, CommitMetadata(frontier=41, position=9, max_event_ms=None), 0)
    assert engine.replaying(P0) is False
    assert commit_points(engine)[P0].metadata.frontier == 41
    feed(engine, P0, 7, numbered(2), now_ms=1)
    assert [w.input_rows for w in engine.close_due(2)] == [2]
    point = commit_points(engine)[P0]
    assert (point.offset, point.metadata.frontier) == (8, 42)


def test_count_window_discard() -> None:
    engine = count_engine(batches=2, idle_timeout_ms=10)
    engine.assign(P0, None, None, now_ms=0)
    feed(engine, P0, 0, numbered(2), now_ms=0)
    feed(engine, P0, 1, numbered(2), now_ms=0)  # a ready window
    feed(engine, P0, 2, numbered(2), now_ms=0)  # an open one
    engine.discard()
    assert engine.open_window_count() == 0
    assert engine.cardinality() == 0
    assert engine.close_due(1_000) == []
    feed(engine, P0, 3, numbered(3), now_ms=2_000)
    assert [w.input_rows for w in engine.close_due(3_000)] == [3]


@pytest.mark.parametrize("merge_every", [1, 5])
def test_count_windows_do_not_depend_on_merge_cadence(merge_every: int) -> None:
    engine = count_engine(batches=3, merge_every=merge_every)
    engine.assign(P0, None, None, now_ms=0)
    messages = [numbered(n, start=10 * i) for i, n in enumerate([2, 3, 1, 4, 2, 2])]
    for offset, rows in enumerate(messages):
        feed(engine, P0, offset, rows, now_ms=offset)
    closed = engine.close_due(10)
    assert [w.input_rows for w in closed] == [6, 8]
    for window, chunk in zip(closed, (messages[:3], messages[3:]), strict=True):
        rows = at([row for part in chunk for row in part], 0)
        assert_frame_equal(window.frame.sort("k").drop("window_start", "window_end"),
                           reference(rows)[0].drop("window_start", "window_end"))


def test_count_window_over_budget_closes_early() -> None:
    engine = count_engine(batches=10)
    engine.assign(P0, None, None, now_ms=0)
    feed(engine, P0, 0, [("a", 0, 1.0, 1, 1.0)], now_ms=5)
    closed = engine.emit_early(6)
    assert len(closed) == 1
    assert closed[0].final
    assert closed[0].input_rows == 1
    assert engine.open_window_count() == 0
