"""Tumbling and hopping windows by event and processing time: closing, lateness, replays
after a restart, idleness, commit points, early revisions."""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from consumer.core.offsets import CommitMetadata, CommitPoint
from consumer.core.plan import derive_plan
from consumer.core.types import ClosedWindow, MessageRef
from consumer.core.windows.bounds import WindowSpec
from consumer.core.windows.time.engine import TimeWindowEngine
from tests.consumer.core.windows.helpers import (
    EVENT_PLAN,
    P0,
    P1,
    PROCESSING_PLAN,
    UTC_MS,
    Row,
    at,
    check_windows,
    commit_points,
    feed,
    frame,
    processing_engine,
    reference,
    starts,
    time_engine,
)


def test_the_plan_is_what_these_tests_assume() -> None:
    assert EVENT_PLAN.keys == ("k",)
    assert [(a.name, a.func) for a in EVENT_PLAN.aggregates] == [
        ("v_sum", "sum"), ("n_count", "sum"), ("v_max", "max")]
    assert PROCESSING_PLAN.keys == ("k",)
    assert PROCESSING_PLAN.time_column is None


# Two partitions, rows over four one-second windows, delivered as five messages.
M_P0_0: list[Row] = [("a", 100, 1.0, 1, 1.0), ("b", 900, 2.0, 2, 5.0), ("a", 1_200, 0.5, 3, 3.0)]
M_P1_0: list[Row] = [("a", 300, 4.0, 1, 7.0), ("b", 2_100, 1.25, 4, -1.0)]
M_P0_1: list[Row] = [
    ("b", 1_500, 8.0, 5, 2.0), ("a", 2_500, 0.25, 6, 4.0), ("a", 1_999, 1.0, 1, 9.5)]
M_P1_1: list[Row] = [("a", 3_100, 2.0, 7, 0.0)]
M_P0_2: list[Row] = [("c", 3_600, 16.0, 8, 6.0), ("a", 2_000, 3.0, 9, 8.0)]


# -- event time --------------------------------------------------------------------------


def test_event_time_windows_close_in_order_with_exact_aggregates() -> None:
    engine = time_engine()
    engine.assign(P0, None, None, now_ms=0)
    engine.assign(P1, None, None, now_ms=0)
    expected = reference([*M_P0_0, *M_P1_0, *M_P0_1, *M_P1_1, *M_P0_2])
    assert list(expected) == [0, 1_000, 2_000, 3_000]

    assert feed(engine, P0, 0, M_P0_0, now_ms=10) is None
    assert engine.close_due(10) == []  # P1 has sent nothing yet: the watermark is held
    assert feed(engine, P1, 0, M_P1_0, now_ms=20) is None
    first = engine.close_due(20)  # watermark min(1200, 2100)
    check_windows(first, {0: expected[0]})

    feed(engine, P0, 1, M_P0_1, now_ms=30)
    second = engine.close_due(30)  # min(2500, 2100)
    check_windows(second, {1_000: expected[1_000]})

    feed(engine, P1, 1, M_P1_1, now_ms=40)
    assert engine.close_due(40) == []  # min(2500, 3100): [2000, 3000) still open
    feed(engine, P0, 2, M_P0_2, now_ms=50)
    third = engine.close_due(50)  # min(3600, 3100)
    check_windows(third, {2_000: expected[2_000]})
    assert engine.open_window_count() == 1
    assert engine.late_rows == 0


def test_window_bounds_are_utc_millisecond_datetimes() -> None:
    engine = time_engine(spec=WindowSpec.tumbling(60_000))
    engine.assign(P0, None, None, now_ms=0)
    rows: list[Row] = [("x", 1_700_000_012_345, 1.0, 1, 1.0)]
    feed(engine, P0, 0, rows, now_ms=0)
    (window,) = engine.close_due(10**9)  # all idle
    assert (window.start_ms, window.end_ms) == (1_699_999_980_000, 1_700_000_040_000)
    bounds = window.frame.select("window_start", "window_end")
    assert bounds.schema == pl.Schema({"window_start": UTC_MS, "window_end": UTC_MS})
    assert bounds.row(0) == (
        pl.Series([1_699_999_980_000]).cast(UTC_MS)[0],
        pl.Series([1_700_000_040_000]).cast(UTC_MS)[0],
    )
    assert str(bounds["window_start"][0]) == "2023-11-14 22:13:00+00:00"


def test_lateness_delays_the_close() -> None:
    engine = time_engine(lateness_ms=500)
    engine.assign(P0, None, None, now_ms=0)
    feed(engine, P0, 0, [("a", 100, 1.0, 1, 1.0), ("a", 1_400, 1.0, 1, 1.0)], now_ms=0)
    assert engine.close_due(1) == []  # watermark 900
    feed(engine, P0, 1, [("a", 1_500, 1.0, 1, 1.0)], now_ms=2)
    assert starts(engine.close_due(3)) == [0]  # watermark 1000


def test_late_rows_are_returned_counted_and_not_aggregated() -> None:
    engine = time_engine()
    engine.assign(P0, None, None, now_ms=0)
    feed(engine, P0, 0, [("a", 100, 1.0, 1, 1.0), ("a", 1_500, 2.0, 1, 2.0)], now_ms=0)
    assert starts(engine.close_due(1)) == [0]  # watermark 1500

    late_rows: list[Row] = [("a", 200, 100.0, 100, 100.0), ("b", 999, 3.0, 3, 3.0)]
    on_time: list[Row] = [("a", 1_000, 4.0, 1, 4.0)]
    late = feed(engine, P0, 1, [*late_rows, *on_time], now_ms=2)
    assert late is not None
    # Each late row says which of the poll's messages it came from (its index: 0, the
    # only one) and which window it missed.
    expected_late = frame(late_rows).with_columns(
        __message=pl.lit(0, pl.Int64), window_start=pl.lit(0, pl.Int64),
        window_end=pl.lit(1_000, pl.Int64))
    assert_frame_equal(late, expected_late)
    assert engine.late_rows == 2
    assert engine.skipped_replayed_rows == 0

    rest = engine.close_due(10**9)  # all idle
    check_windows(rest, reference([("a", 1_500, 2.0, 1, 2.0), *on_time]))


def test_message_of_only_late_rows_is_done_at_once() -> None:
    engine = time_engine()
    engine.assign(P0, None, None, now_ms=0)
    feed(engine, P0, 0, [("a", 1_500, 1.0, 1, 1.0)], now_ms=0)
    engine.close_due(1)  # frontier 1500: [0, 1000) is closed (it was empty)
    feed(engine, P0, 1, [("a", 1_000, 1.0, 1, 1.0)], now_ms=2)
    late = feed(engine, P0, 2, [("a", 10, 1.0, 1, 1.0)], now_ms=3)
    assert late is not None
    assert late.height == 1
    # Offsets 0 and 1 wait for [1000, 2000); the late message 2 does not hold anything.
    assert commit_points(engine)[P0].offset == 0
    engine.close_due(10**9)
    assert commit_points(engine)[P0].offset == 3


def test_replayed_rows_of_emitted_windows_are_skipped() -> None:
    engine = time_engine()
    engine.assign(P0, 4, CommitMetadata(frontier=2_000, position=7, max_event_ms=2_400),
                  now_ms=0)
    assert engine.replaying(P0)
    replayed: list[Row] = [("a", 1_900, 5.0, 5, 5.0), ("a", 2_300, 1.0, 1, 1.0)]
    assert feed(engine, P0, 4, replayed, now_ms=1) is None
    assert engine.skipped_replayed_rows == 1
    assert engine.late_rows == 0
    check_windows(engine.close_due(10**9), reference([("a", 2_300, 1.0, 1, 1.0)]))


def test_after_the_replay_old_rows_are_late() -> None:
    engine = time_engine()
    engine.assign(P0, 4, CommitMetadata(frontier=2_000, position=7, max_event_ms=2_400),
                  now_ms=0)
    late = feed(engine, P0, 7, [("a", 1_900, 5.0, 5, 5.0)], now_ms=1)
    assert late is not None
    assert late.height == 1
    assert engine.late_rows == 1
    assert engine.skipped_replayed_rows == 0


def test_assign_restores_frontier_and_event_progress() -> None:
    engine = time_engine(lateness_ms=100)
    engine.assign(P0, 3, CommitMetadata(frontier=4_000, position=3, max_event_ms=5_000),
                  now_ms=0)
    assert commit_points(engine) == {
        P0: CommitPoint(3, CommitMetadata(frontier=4_000, position=3, max_event_ms=5_000))}
    # The restored maximum drives the watermark (4900) before any new message arrives.
    feed(engine, P0, 3, [("a", 4_500, 1.0, 1, 1.0), ("a", 5_050, 1.0, 1, 1.0)], now_ms=1)
    assert engine.close_due(2) == []
    feed(engine, P0, 4, [("a", 5_100, 1.0, 1, 1.0)], now_ms=3)
    assert starts(engine.close_due(4)) == [4_000]  # watermark 5000


def test_each_partition_keeps_its_own_restored_frontier() -> None:
    # P0 comes back from this instance's commit, P1 from another instance that had
    # emitted less: P1's rows of [2000, 3000) were never emitted, so they are not late.
    engine = time_engine()
    engine.assign(P0, 0, CommitMetadata(frontier=3_000, position=0, max_event_ms=None), 0)
    engine.assign(P1, 0, CommitMetadata(frontier=2_000, position=0, max_event_ms=None), 0)
    assert feed(engine, P1, 0, [("a", 2_500, 1.0, 1, 1.0)], now_ms=1) is None
    late = feed(engine, P0, 0, [("a", 2_500, 1.0, 1, 1.0)], now_ms=1)
    assert late is not None
    assert late.height == 1
    points = commit_points(engine)
    assert (points[P0].metadata.frontier, points[P1].metadata.frontier) == (3_000, 2_000)


def test_a_partition_without_a_commit_starts_at_the_instances_frontier() -> None:
    engine = time_engine()
    engine.assign(P0, None, None, now_ms=0)
    feed(engine, P0, 0, [("a", 100, 1.0, 1, 1.0), ("a", 2_100, 1.0, 1, 1.0)], now_ms=1)
    assert starts(engine.close_due(2)) == [0]
    engine.assign(P1, None, None, now_ms=3)  # new: never consumed by anyone
    late = feed(engine, P1, 0, [("b", 500, 1.0, 1, 1.0)], now_ms=4)
    assert late is not None  # [0, 1000) is closed here: P1's row is late, not a 2nd emission
    assert late.height == 1


def test_taken_over_partition_reopens_a_closed_window_until_its_replay_passes_it() -> None:
    # This instance closed [1000, 2000) for P0; P1 arrives from an instance that emitted
    # only up to 1000 and had read up to offset 3 (max event 2_900).
    engine = time_engine(lateness_ms=0)
    engine.assign(P0, None, None, now_ms=0)
    feed(engine, P0, 0, [("a", 1_100, 1.0, 1, 1.0), ("a", 2_900, 1.0, 1, 1.0)], now_ms=1)
    assert starts(engine.close_due(2)) == [1_000]
    engine.assign(P1, 1, CommitMetadata(frontier=1_000, position=3, max_event_ms=2_900), 3)
    assert engine.replaying(P1)
    assert feed(engine, P1, 1, [("b", 900, 4.0, 4, 4.0), ("b", 1_500, 1.0, 1, 1.0)],
                now_ms=4) is None
    # The restored max (2_900) must not close [1000, 2000) before P1's offset 2 is read.
    assert engine.close_due(5) == []
    assert feed(engine, P1, 2, [("b", 1_700, 2.0, 2, 2.0), ("b", 2_050, 1.0, 1, 1.0)],
                now_ms=6) is None
    assert not engine.replaying(P1)
    assert engine.skipped_replayed_rows == 1  # the row of [0, 1000), emitted by P1's owner
    closed = engine.close_due(7)  # watermark 2_900 once P1 has caught up
    check_windows(closed, reference([("b", 1_500, 1.0, 1, 1.0), ("b", 1_700, 2.0, 2, 2.0)]))
    assert commit_points(engine)[P1] == CommitPoint(
        2, CommitMetadata(frontier=2_900, position=3, max_event_ms=2_900))


def test_commit_metadata_keeps_the_replay_range_until_it_is_passed() -> None:
    # Run 1 emitted [0, 1000) holding rows of offsets 0 and 1 and committed offset 0 with
    # position 2. Run 2 replays offset 0 and commits: if the metadata now says position 1,
    # a crash before offset 1 is reprocessed makes run 3 count offset 1's already-emitted
    # row as late instead of skipping it.
    meta = CommitMetadata(frontier=1_500, position=2, max_event_ms=1_600)
    engine = time_engine()
    engine.assign(P0, 0, meta, now_ms=0)
    assert commit_points(engine)[P0].metadata.position == 2  # nothing replayed yet
    feed(engine, P0, 0, [("a", 100, 1.0, 1, 1.0), ("a", 1_500, 1.0, 1, 1.0)], now_ms=1)
    point = commit_points(engine)[P0]
    assert point.offset == 0
    assert point.metadata.position == 2


def test_all_idle_closes_everything_and_commits_everything() -> None:
    engine = time_engine(idle_timeout_ms=1_000)
    engine.assign(P0, None, None, now_ms=0)
    engine.assign(P1, None, None, now_ms=0)
    rows0: list[Row] = [("a", 100, 1.0, 1, 1.0), ("a", 5_100, 2.0, 2, 2.0)]
    rows1: list[Row] = [("b", 2_100, 4.0, 4, 4.0)]
    feed(engine, P0, 0, rows0, now_ms=100)
    feed(engine, P1, 0, rows1, now_ms=200)
    assert starts(engine.close_due(300)) == [0]  # watermark 2100
    assert engine.close_due(1_199) == []  # P0 is idle, P1 is not yet
    closed = engine.close_due(1_200)
    check_windows(closed, {s: f for s, f in reference([*rows0, *rows1]).items() if s > 0})
    assert engine.open_window_count() == 0
    assert commit_points(engine) == {
        P0: CommitPoint(1, CommitMetadata(frontier=6_000, position=1, max_event_ms=5_100)),
        P1: CommitPoint(1, CommitMetadata(frontier=6_000, position=1, max_event_ms=2_100)),
    }
    late = feed(engine, P1, 1, [("b", 5_999, 1.0, 1, 1.0)], now_ms=1_300)
    assert late is not None  # the idle close moved the frontier past [5000, 6000)


def test_silent_partition_holds_until_idle_since_the_first_message() -> None:
    engine = time_engine(idle_timeout_ms=1_000)
    engine.assign(P0, None, None, now_ms=0)
    engine.assign(P1, None, None, now_ms=0)  # never sends anything
    feed(engine, P0, 0, [("a", 100, 1.0, 1, 1.0), ("a", 1_500, 1.0, 1, 1.0)], now_ms=500)
    feed(engine, P0, 1, [("a", 1_600, 1.0, 1, 1.0)], now_ms=1_200)
    assert engine.close_due(1_499) == []  # P1 may be fetched a poll after P0
    assert starts(engine.close_due(1_500)) == [0]  # P1 idle now; P0 alone: watermark 1600
    assert engine.open_window_count() == 1


def test_a_partition_taken_over_mid_pause_does_not_close_the_idle_ones_windows() -> None:
    """P1 is taken over (its previous owner read offsets 3-4) while P0 is idle between two
    chunks; the next chunk reaches P1 first. P0's rows of that chunk are not late."""
    engine = time_engine(idle_timeout_ms=1_000)
    engine.assign(P0, None, None, now_ms=0)
    feed(engine, P0, 0, [("a", 100, 1.0, 1, 1.0), ("a", 1_900, 1.0, 1, 1.0)], now_ms=0)
    engine.assign(P1, 3, CommitMetadata(frontier=1_000, position=5, max_event_ms=1_950),
                  now_ms=5_000)
    feed(engine, P1, 3, [("b", 1_100, 1.0, 1, 1.0)], now_ms=5_050)  # replayed
    feed(engine, P1, 4, [("b", 1_950, 1.0, 1, 1.0)], now_ms=5_050)
    feed(engine, P1, 5, [("b", 2_100, 1.0, 1, 1.0), ("b", 3_100, 1.0, 1, 1.0)], now_ms=5_600)
    assert starts(engine.close_due(5_600)) == [0]  # P0 holds: watermark 1900
    late = feed(engine, P0, 1, [("a", 2_200, 1.0, 1, 1.0), ("a", 3_200, 1.0, 1, 1.0)],
                now_ms=5_650)
    assert late is None
    assert engine.late_rows == 0
    assert starts(engine.close_due(5_650)) == [1_000, 2_000]


def test_a_quiet_partition_is_idle_to_stage_two_only_once_its_rows_are_sent() -> None:
    """Stage 2 of the scale-out leaves an idle partition's frontier out of its floor. P0
    falls quiet with a row in [1000, 2000), which stays open: P1, just taken over with its
    frontier restored past that window, is not idle yet. P0 is not reported idle until the
    window is sent (all idle: it closes), or stage 2 would emit it without P0's row."""
    engine = time_engine(idle_timeout_ms=1_000)
    engine.assign(P0, None, None, now_ms=0)
    feed(engine, P0, 0, [("a", 1_500, 1.0, 1, 1.0)], now_ms=0)
    engine.assign(P1, 5, CommitMetadata(frontier=2_000, position=5, max_event_ms=1_900),
                  now_ms=500)
    assert engine.close_due(1_050) == []  # P0 quiet; P1's watermark 1900 holds the window
    assert engine.frontiers(1_050) == {P0: (1_900, False), P1: (2_000, False)}
    assert starts(engine.close_due(1_500)) == [1_000]  # all idle
    assert engine.frontiers(1_500) == {P0: (2_000, True), P1: (2_000, True)}


def test_commit_points_follow_the_closed_windows() -> None:
    engine = time_engine()
    engine.assign(P0, None, None, now_ms=0)
    engine.assign(P1, 10, None, now_ms=0)
    assert set(commit_points(engine)) == {P1}  # P0: nothing consumed, nothing committed
    feed(engine, P0, 0, M_P0_0, now_ms=1)  # last window end 2000
    feed(engine, P1, 10, M_P1_0, now_ms=1)  # 3000
    feed(engine, P0, 1, M_P0_1, now_ms=1)  # 3000
    assert commit_points(engine) == {
        P0: CommitPoint(0, CommitMetadata(frontier=None, position=2, max_event_ms=2_500)),
        P1: CommitPoint(10, CommitMetadata(frontier=None, position=11, max_event_ms=2_100)),
    }
    engine.close_due(2)  # watermark 2100: [0, 2000) emitted
    assert commit_points(engine) == {
        P0: CommitPoint(1, CommitMetadata(frontier=2_100, position=2, max_event_ms=2_500)),
        P1: CommitPoint(10, CommitMetadata(frontier=2_100, position=11, max_event_ms=2_100)),
    }
    engine.skip(P1, 11, now_ms=3)  # a rejected message
    feed(engine, P1, 12, [("a", 3_000, 1.0, 1, 1.0)], now_ms=3)
    engine.close_due(4)  # watermark 2500: nothing more closes
    assert commit_points(engine)[P1].offset == 10
    feed(engine, P0, 2, [("a", 4_100, 1.0, 1, 1.0)], now_ms=5)
    engine.close_due(6)  # watermark 3000: [2000, 3000) emitted
    points = commit_points(engine)
    assert (points[P0].offset, points[P1].offset) == (2, 12)
    assert points[P1].metadata == CommitMetadata(frontier=3_000, position=13,
                                                 max_event_ms=3_000)


def test_revoke_stops_a_partition_holding_the_watermark() -> None:
    engine = time_engine()
    engine.assign(P0, None, None, now_ms=0)
    engine.assign(P1, None, None, now_ms=0)
    feed(engine, P0, 0, [("a", 100, 1.0, 1, 1.0), ("a", 2_500, 1.0, 1, 1.0)], now_ms=1)
    feed(engine, P1, 0, [("a", 200, 1.0, 1, 1.0)], now_ms=1)
    assert engine.close_due(2) == []  # watermark 200
    engine.revoke(P1)
    assert starts(engine.close_due(3)) == [0]
    assert set(commit_points(engine)) == {P0}


def test_integer_epoch_ms_time_column() -> None:
    schema = pa.schema([("k", pa.string()), ("ts", pa.int64()), ("v_sum", pa.float64())])
    plan = derive_plan(schema, time_column="ts")
    engine = TimeWindowEngine(plan, WindowSpec.tumbling(10), event_time=True,
                              time_dtype=pl.Int64(), allowed_lateness_ms=0,
                              idle_timeout_ms=1_000, merge_every=1)
    engine.assign(P0, None, None, now_ms=0)
    data = pl.DataFrame({"k": ["a", "a", "b"], "ts": [-1, 3, 15], "v_sum": [1.0, 2.0, 4.0]})
    engine.add(data, [MessageRef(P0, 0, 3, min_event_ms=-1, max_event_ms=15)], now_ms=0)
    closed = engine.close_due(1_000)
    assert [(w.start_ms, w.end_ms) for w in closed] == [(-10, 0), (0, 10), (10, 20)]
    assert [w.frame["v_sum"].to_list() for w in closed] == [[1.0], [2.0], [4.0]]


# -- processing time ---------------------------------------------------------------------


def test_processing_time_windows_follow_the_wall_clock() -> None:
    engine = processing_engine()
    engine.assign(P0, None, None, now_ms=0)
    first: list[Row] = [("a", 0, 1.0, 1, 1.0), ("b", 0, 2.0, 2, 2.0)]
    second: list[Row] = [("a", 0, 4.0, 4, 4.0)]
    engine.add(frame(first, with_ts=False), [MessageRef(P0, 0, 2)], now_ms=10_250)
    engine.add(frame(second, with_ts=False), [MessageRef(P0, 1, 1)], now_ms=10_999)
    engine.add(frame(second, with_ts=False), [MessageRef(P0, 2, 1)], now_ms=11_000)
    assert engine.close_due(10_999) == []
    closed = engine.close_due(11_000)
    # The reference puts every row at the time its message arrived.
    expected = reference([*at(first, 10_250), *at(second, 10_999)])
    check_windows(closed, expected)
    assert commit_points(engine)[P0].offset == 2
    assert engine.close_due(11_999) == []
    assert starts(engine.close_due(12_000)) == [11_000]
    assert commit_points(engine)[P0] == CommitPoint(
        3, CommitMetadata(frontier=12_000, position=3, max_event_ms=11_000))


def test_processing_time_never_replays() -> None:
    engine = processing_engine()
    engine.assign(P0, 5, CommitMetadata(frontier=1_000, position=9, max_event_ms=None), 0)
    assert engine.replaying(P0) is False
    # Replayed input counts in the window open now (processing time is not reproducible).
    assert engine.add(frame([("a", 0, 1.0, 1, 1.0)], with_ts=False),
                      [MessageRef(P0, 5, 1)], now_ms=2_500) is None
    assert engine.skipped_replayed_rows == 0
    assert starts(engine.close_due(3_000)) == [2_000]


def test_event_time_needs_its_column_and_type() -> None:
    with pytest.raises(ValueError, match="event-time windows need"):
        TimeWindowEngine(PROCESSING_PLAN, WindowSpec.tumbling(10), event_time=True,
                         time_dtype=UTC_MS, allowed_lateness_ms=0, idle_timeout_ms=1,
                         merge_every=1)
    with pytest.raises(ValueError, match="event-time windows need"):
        TimeWindowEngine(EVENT_PLAN, WindowSpec.tumbling(10), event_time=True,
                         time_dtype=None, allowed_lateness_ms=0, idle_timeout_ms=1,
                         merge_every=1)


# -- hopping windows ---------------------------------------------------------------------


def test_hopping_windows_count_each_row_size_over_step_times() -> None:
    spec = WindowSpec.hopping(3_000, 1_000)
    engine = time_engine(spec=spec)
    engine.assign(P0, None, None, now_ms=0)
    rows: list[Row] = [("a", 100, 1.0, 1, 1.0), ("b", 1_100, 2.0, 2, 3.0),
                       ("a", 2_500, 4.0, 4, 0.5), ("a", 2_999, 8.0, 8, 2.0)]
    feed(engine, P0, 0, rows, now_ms=0)
    closed = engine.close_due(10**9)
    expected = reference(rows, 3_000, 1_000)
    assert list(expected) == [-2_000, -1_000, 0, 1_000, 2_000]
    check_windows(closed, expected)
    assert [w.end_ms - w.start_ms for w in closed] == [3_000] * 5
    assert sum(w.input_rows for w in closed) == 3 * len(rows)


def test_hopping_windows_close_one_step_at_a_time() -> None:
    engine = time_engine(spec=WindowSpec.hopping(2_000, 500))
    engine.assign(P0, None, None, now_ms=0)
    feed(engine, P0, 0, [("a", 0, 1.0, 1, 1.0)], now_ms=0)
    feed(engine, P0, 1, [("a", 1_000, 1.0, 1, 1.0)], now_ms=0)
    assert starts(engine.close_due(1)) == [-1_500, -1_000]  # watermark 1000
    feed(engine, P0, 2, [("a", 1_600, 1.0, 1, 1.0)], now_ms=2)
    closed = engine.close_due(3)  # watermark 1600
    assert [(w.start_ms, w.input_rows) for w in closed] == [(-500, 2)]



def test_a_hopping_row_is_late_only_for_its_emitted_windows() -> None:
    engine = time_engine(spec=WindowSpec.hopping(2_000, 1_000))
    engine.assign(P0, None, None, now_ms=0)
    feed(engine, P0, 0, [("a", 500, 1.0, 1, 1.0), ("a", 2_000, 1.0, 1, 1.0)], now_ms=0)
    assert starts(engine.close_due(1)) == [-1_000, 0]  # watermark 2000
    # 1_500 lies in [0, 2000), emitted, and in [1000, 3000), still open.
    late = feed(engine, P0, 1, [("b", 1_500, 4.0, 4, 4.0)], now_ms=2)
    assert late is not None
    assert late["window_start"].to_list() == [0]
    rest = engine.close_due(10**9)
    check_windows(rest, {s: f for s, f in reference(
        [("a", 2_000, 1.0, 1, 1.0), ("b", 1_500, 4.0, 4, 4.0)], 2_000, 1_000).items()
        if s >= 1_000})

# -- merge cadence and store -------------------------------------------------------------


def run_scenario(merge_every: int) -> list[ClosedWindow]:
    engine = time_engine(merge_every=merge_every)
    engine.assign(P0, None, None, now_ms=0)
    engine.assign(P1, None, None, now_ms=0)
    closed: list[ClosedWindow] = []
    messages = [(P0, M_P0_0), (P1, M_P1_0), (P0, M_P0_1), (P1, M_P1_1), (P0, M_P0_2)]
    for offset, (partition, rows) in enumerate(messages):
        feed(engine, partition, offset, rows, now_ms=offset)
        closed += engine.close_due(offset)
    return closed + engine.close_due(10**9)


def test_merge_cadence_does_not_change_results() -> None:
    every_batch, every_fifth = run_scenario(1), run_scenario(5)
    assert starts(every_batch) == starts(every_fifth) == [0, 1_000, 2_000, 3_000]
    for a, b in zip(every_batch, every_fifth, strict=True):
        assert (a.start_ms, a.end_ms, a.input_rows) == (b.start_ms, b.end_ms, b.input_rows)
        assert_frame_equal(a.frame, b.frame, check_row_order=False)
    check_windows(every_fifth, reference([*M_P0_0, *M_P1_0, *M_P0_1, *M_P1_1, *M_P0_2]))


def test_discard_forgets_open_windows() -> None:
    engine = time_engine()
    engine.assign(P0, None, None, now_ms=0)
    feed(engine, P0, 0, M_P0_0, now_ms=0)
    feed(engine, P0, 1, M_P0_1, now_ms=0)
    assert engine.open_window_count() == 3
    assert engine.cardinality() > 0
    engine.discard()
    assert engine.open_window_count() == 0
    assert engine.cardinality() == 0
    assert engine.close_due(10**9) == []
    # The engine keeps working on fresh rows.
    fresh: list[Row] = [("z", 7_000, 1.0, 1, 1.0)]
    feed(engine, P0, 2, fresh, now_ms=10**9)
    check_windows(engine.close_due(2 * 10**9), reference(fresh))


def test_empty_message_feeds_no_window() -> None:
    engine = time_engine()
    engine.assign(P0, None, None, now_ms=0)
    assert feed(engine, P0, 0, [], now_ms=0) is None
    assert engine.open_window_count() == 0
    assert commit_points(engine)[P0].offset == 1


message_rows = st.lists(
    st.tuples(st.sampled_from("abc"), st.integers(-3_000, 6_000),
              st.integers(-64, 64).map(lambda i: i / 4), st.integers(-100, 100),
              st.integers(-64, 64).map(lambda i: i / 2)),
    max_size=6,
)


@given(messages=st.lists(st.tuples(st.sampled_from([P0, P1]), message_rows), max_size=8),
       merge_every=st.integers(1, 4), hopping=st.booleans())
def test_any_split_gives_the_reference_result(
    messages: list[tuple[tuple[str, int], list[Row]]], merge_every: int, hopping: bool
) -> None:
    spec = WindowSpec.hopping(1_000, 500) if hopping else WindowSpec.tumbling(1_000)
    engine = time_engine(spec=spec, merge_every=merge_every)
    offsets = {P0: 0, P1: 0}
    for partition, rows in messages:
        feed(engine, partition, offsets[partition], rows, now_ms=0)
        offsets[partition] += 1
    closed = engine.close_due(10**9)
    all_rows = [row for _, rows in messages for row in rows]
    check_windows(closed, reference(all_rows, spec.size_ms, spec.step_ms))


# -- count windows -----------------------------------------------------------------------


# -- memory budget: early revisions ------------------------------------------------------


def test_emit_early_gives_non_final_revisions_that_add_up_to_the_window() -> None:
    engine = time_engine()
    engine.assign(P0, None, None, now_ms=0)
    first = [("a", 100, 1.0, 1, 5.0), ("b", 200, 2.0, 1, 6.0)]
    second = [("a", 300, 4.0, 2, 9.0), ("c", 400, 8.0, 1, 1.0)]
    feed(engine, P0, 0, first, now_ms=10)
    early = engine.emit_early(10)
    assert [(w.start_ms, w.final, w.revision) for w in early] == [(0, False, 0)]
    check_windows(early, {0: reference(first)[0]})
    assert engine.cardinality() == 0  # the budget is freed
    # everything consumed is in emitted output, so its offset may be committed
    assert commit_points(engine)[P0].offset == 1

    feed(engine, P0, 1, second, now_ms=20)
    feed(engine, P0, 2, [("a", 1_500, 0.5, 1, 0.5)], now_ms=30)  # moves the watermark
    final = engine.close_due(30)
    assert [(w.start_ms, w.final, w.revision) for w in final] == [(0, True, 1)]
    check_windows(final, {0: reference(second)[0]})  # the rows since the early revision


