"""The session engine with plain frames: merging, closing, lateness, commit offsets,
replay after a crash; results compared with the DuckDB reference (session_harness)."""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

from consumer.core.late import late_records
from consumer.core.offsets import CommitMetadata, CommitPoint
from consumer.core.plan import derive_plan
from consumer.core.types import MessageRef
from consumer.core.windows.session.engine import MAX_LISTED_KEYS, SessionWindowEngine
from consumer.core.windows.session.spans import SessionSpec
from tests.consumer.core.windows.helpers import (
    P0,
    P1,
    PROCESSING_PLAN,
    Row,
    frame,
    ref,
)
from tests.consumer.core.windows.session.harness import (
    MiniDaemon,
    committable,
    emitted,
    feed,
    session_engine,
    session_reference,
)


def starts_ends(windows: list) -> list[tuple[int, int]]:  # type: ignore[type-arg]
    frames = emitted(windows)
    return list(zip(frames["window_start"].dt.epoch("ms").to_list(),
                    frames["window_end"].dt.epoch("ms").to_list(), strict=True))


def row(k: str | None, ts: int, v: float = 1.0) -> Row:
    return (k, ts, v, 1, v)  # type: ignore[return-value]


# -- sessions ----------------------------------------------------------------------------


def test_a_session_is_first_row_to_last_row_plus_gap_and_closes_on_the_watermark() -> None:
    engine = session_engine(gap_ms=100)
    engine.assign(P0, None, None, now_ms=0)
    rows = [row("a", 1_000), row("a", 1_050, 2.0), row("b", 1_060), row("a", 1_149, 4.0)]
    feed(engine, P0, 0, rows, now_ms=1)
    assert engine.close_due(1) == []  # watermark 1149: b's session ends at 1160
    feed(engine, P0, 1, [row("c", 1_200)], now_ms=2)
    (first,) = engine.close_due(2)  # watermark 1200: b's [1060, 1160) closes
    assert_frame_equal(emitted([first]), session_reference([rows[2]], 100))
    feed(engine, P0, 2, [row("c", 1_249)], now_ms=3)
    (second,) = engine.close_due(3)  # watermark 1249: a's [1000, 1249) closes
    assert_frame_equal(emitted([second]), session_reference([rows[0], rows[1], rows[3]], 100))
    assert (second.start_ms, second.end_ms, second.input_rows) == (1_000, 1_249, 3)
    assert second.final
    assert engine.open_window_count() == 1


def test_a_row_exactly_one_gap_later_starts_a_new_session() -> None:
    engine = session_engine(gap_ms=100)
    engine.assign(P0, None, None, now_ms=0)
    rows = [row("a", 0), row("a", 99), row("a", 199), row("a", 299, 2.0)]
    feed(engine, P0, 0, rows, now_ms=1)
    closed = engine.close_due(10**9)  # all idle
    assert starts_ends(closed) == [(0, 199), (199, 299), (299, 399)]
    assert_frame_equal(emitted(closed), session_reference(rows, 100))


def test_a_row_bridging_two_sessions_of_other_polls_and_partitions_merges_them() -> None:
    engine = session_engine(gap_ms=100)
    engine.assign(P0, None, None, now_ms=0)
    engine.assign(P1, None, None, now_ms=0)
    left, right, bridge = [row("a", 100, 1.0)], [row("a", 260, 2.0)], [row("a", 180, 4.0)]
    feed(engine, P0, 0, left, now_ms=1)
    feed(engine, P1, 0, right, now_ms=2)
    assert engine.open_window_count() == 2
    feed(engine, P0, 1, bridge, now_ms=3)
    assert engine.open_window_count() == 1
    closed = engine.close_due(10**9)
    assert starts_ends(closed) == [(100, 360)]
    assert_frame_equal(emitted(closed), session_reference([*left, *right, *bridge], 100))


def test_sessions_are_per_key_and_null_keys_are_a_key() -> None:
    engine = session_engine(gap_ms=50)
    engine.assign(P0, None, None, now_ms=0)
    rows = [row(None, 0), row("a", 10), row(None, 40, 2.0), row("a", 70), row(None, 200)]
    feed(engine, P0, 0, rows[:3], now_ms=1)
    feed(engine, P0, 1, rows[3:], now_ms=2)
    closed = engine.close_due(10**9)
    assert_frame_equal(emitted(closed), session_reference(rows, 50))
    assert emitted(closed)["k"].null_count() == 2


def test_max_session_ms_cuts_sessions_at_its_multiples() -> None:
    engine = session_engine(gap_ms=100, max_session_ms=1_000)
    engine.assign(P0, None, None, now_ms=0)
    rows = [row("a", t) for t in range(700, 2_300, 80)]  # one chain across two boundaries
    feed(engine, P0, 0, rows[::2], now_ms=1)  # every other row: gaps of 160, three runs
    feed(engine, P0, 1, rows[1::2], now_ms=2)  # the rest bridges them
    closed = engine.close_due(10**9)
    assert starts_ends(closed) == [(700, 1_000), (1_020, 2_000), (2_060, 2_320)]
    assert_frame_equal(emitted(closed), session_reference(rows, 100, 1_000))


def test_without_keys_all_rows_share_the_sessions() -> None:
    schema = pa.schema([("ts", pa.int64()), ("v_sum", pa.float64())])
    plan = derive_plan(schema, time_column="ts")
    engine = SessionWindowEngine(plan, SessionSpec(10), event_time=True,
                                 time_dtype=pl.Int64(), allowed_lateness_ms=0,
                                 idle_timeout_ms=60_000)
    engine.assign(P0, None, None, now_ms=0)
    data = pl.DataFrame({"ts": [5, 0, 30, 12], "v_sum": [1.0, 2.0, 4.0, 8.0]})
    engine.add(data, [MessageRef(P0, 0, 4, 0, 30)], now_ms=1)
    closed = engine.close_due(10**9)
    assert [w.frame.select("v_sum", "row_count").rows() for w in closed] == [
        [(11.0, 3), (4.0, 1)]]


def test_processing_time_sessions_follow_the_messages_kafka_timestamps() -> None:
    engine = SessionWindowEngine(PROCESSING_PLAN, SessionSpec(1_000), event_time=False,
                                 time_dtype=None, allowed_lateness_ms=0,
                                 idle_timeout_ms=60_000)
    engine.assign(P0, None, None, now_ms=0)
    rows = frame([row("a", 0), row("b", 0)], with_ts=False)
    for offset, stamp in enumerate([10_000, 10_400, 12_000]):
        engine.add(rows, [MessageRef(P0, offset, 2, timestamp_ms=stamp)], now_ms=99_999)
    closed = engine.close_due(10**9)
    assert starts_ends(closed) == [(10_000, 11_400), (12_000, 13_000),
                                   (10_000, 11_400), (12_000, 13_000)]
    assert emitted(closed)["row_count"].to_list() == [2, 1, 2, 1]


# -- lateness ----------------------------------------------------------------------------


def test_a_row_that_would_reopen_an_emitted_session_is_late() -> None:
    engine = session_engine(gap_ms=100)
    engine.assign(P0, None, None, now_ms=0)
    feed(engine, P0, 0, [row("a", 1_000), row("a", 1_050)], now_ms=1)
    feed(engine, P0, 1, [row("b", 1_200)], now_ms=2)
    assert starts_ends(engine.close_due(2)) == [(1_000, 1_150)]  # watermark 1200
    on_time = row("a", 2_500, 8.0)  # 1120's own session would end at 1220: not closed
    late = feed(engine, P0, 2, [row("a", 1_120, 100.0), on_time], now_ms=3)
    assert late is not None
    assert late.select("k", "v_sum", "window_start", "window_end").rows() == [
        ("a", 100.0, 1_000, 1_150)]
    assert late["__message"].to_list() == [0]
    assert engine.late_rows == 1
    closed = engine.close_due(10**9)
    assert_frame_equal(emitted(closed), session_reference([row("b", 1_200), on_time], 100))


def test_a_row_whose_own_session_would_already_be_closed_is_late() -> None:
    engine = session_engine(gap_ms=100)
    engine.assign(P0, None, None, now_ms=0)
    feed(engine, P0, 0, [row("a", 5_000)], now_ms=1)
    engine.close_due(1)  # frontier 5000
    late = feed(engine, P0, 1, [row("b", 4_000), row("b", 4_050), row("a", 4_990)], now_ms=2)
    assert late is not None  # b's [4000, 4150) ends before the frontier; a joins its session
    assert late.select("k", "window_start", "window_end").rows() == [
        ("b", 4_000, 4_150), ("b", 4_000, 4_150)]
    closed = engine.close_due(10**9)
    assert_frame_equal(emitted(closed), session_reference([row("a", 4_990), row("a", 5_000)],
                                                          100))


def test_a_late_row_never_joins_a_later_session() -> None:
    engine = session_engine(gap_ms=100)
    engine.assign(P0, None, None, now_ms=0)
    feed(engine, P0, 0, [row("a", 1_000), row("b", 1_150)], now_ms=1)
    engine.close_due(1)  # a's [1000, 1100) closes at watermark 1150
    late = feed(engine, P0, 1, [row("a", 1_090), row("a", 1_150)], now_ms=2)
    assert late is not None  # 1090 would reopen it; 1150, 60 ms on, starts a new one
    assert late["ts"].dt.epoch("ms").to_list() == [1_090]
    closed = engine.close_due(10**9)
    assert ("a", 1_150, 1_250) in [
        (k, s, e) for k, s, e in emitted(closed).select(
            "k", pl.col("window_start").dt.epoch("ms"),
            pl.col("window_end").dt.epoch("ms")).rows()]


# -- offsets -----------------------------------------------------------------------------


def test_the_commit_offset_waits_for_the_first_message_of_an_open_session() -> None:
    engine = session_engine(gap_ms=100)
    engine.assign(P0, None, None, now_ms=0)
    engine.assign(P1, 10, None, now_ms=0)
    feed(engine, P0, 0, [row("a", 1_000)], now_ms=1)
    feed(engine, P0, 1, [row("b", 1_010)], now_ms=2)
    feed(engine, P1, 10, [row("c", 1_100)], now_ms=3)
    feed(engine, P0, 2, [row("b", 1_150)], now_ms=4)
    assert starts_ends(engine.close_due(4)) == [(1_000, 1_100)]  # watermark 1100: a
    points = committable(engine)
    # b and c are open; a row at 1_050 would still reopen a (its own session would end
    # after the watermark), so a's message stays to be replayed
    assert (points[P0].offset, points[P1].offset) == (0, 10)
    feed(engine, P1, 11, [row("b", 1_080), row("c", 1_400)], now_ms=5)  # b's two merge
    feed(engine, P0, 3, [row("d", 1_600)], now_ms=6)
    assert starts_ends(engine.close_due(6)) == [(1_010, 1_250), (1_100, 1_200)]
    points = committable(engine)  # watermark 1400: c's next session holds P1@11, and
    # no row can reach the closed ones any more (they end a gap or more before it)
    assert (points[P0].offset, points[P1].offset) == (3, 11)
    assert points[P0].metadata == CommitMetadata(frontier=1_400, position=4,
                                                 max_event_ms=1_600)


def test_an_early_revision_releases_every_offset_and_the_session_goes_on() -> None:
    engine = session_engine(gap_ms=100)
    engine.assign(P0, None, None, now_ms=0)
    feed(engine, P0, 0, [row("a", 1_000, 1.0), row("b", 1_000, 2.0)], now_ms=1)
    early = engine.emit_early(1)
    assert [(w.final, w.revision, w.kind, w.input_rows) for w in early] == [
        (False, 0, "delta", 2)]
    assert committable(engine)[P0].offset == 1
    assert engine.cardinality() == 2  # the bounds stay, the state is gone
    feed(engine, P0, 1, [row("a", 1_080, 4.0)], now_ms=2)
    closed = engine.close_due(10**9)
    assert [(w.final, w.revision, w.kind, w.input_rows) for w in closed] == [
        (True, 1, "delta", 1)]  # rows since the early revision, to add to it
    assert starts_ends(closed) == [(1_000, 1_180)]  # b's session closed with nothing new


def test_rows_joining_a_session_an_early_revision_emptied_survive_a_crash() -> None:
    # After the early revision, a's session keeps only its bounds [1000, 1190). The row at
    # 1050 joins it from behind the frontier (1150): replayed alone it would look like a
    # session [1050, 1150) already emitted. The commit lists a, so the replay keeps it.
    messages = {P0: [[row("a", 1_000), row("a", 1_090)], [row("z", 1_150)],
                     [row("a", 1_050, 4.0)], [row("z", 1_500)]]}
    daemon = MiniDaemon(messages, gap_ms=100)
    daemon.poll([P0])
    daemon.flush(early=True)
    daemon.poll([P0])
    daemon.flush()
    daemon.poll([P0])
    daemon.flush()
    assert len(committable(daemon.engine)[P0].metadata.closed) == 1
    daemon.crash()
    output = daemon.finish()
    assert [(w.final, w.input_rows) for w in output.windows if w.frame["k"][0] == "a"] == [
        (False, 2), (True, 1)]
    assert sum(w.input_rows for w in output.windows) + output.late_rows() == 5


def test_deltas_after_a_restart_number_on_past_the_early_revisions_before_it() -> None:
    # The early revision let a@1's row go; after the crash nothing is replayed, and the
    # second a@1 opens a session of the same keys and start. Numbered from 0 again, its
    # delta would repeat the first one's (keys, start, revision, kind), and subscribers
    # skip a repeat (docs/wire-format.md).
    daemon = MiniDaemon({P0: [[row("a", 1)], [row("a", 1)]]}, gap_ms=50)
    daemon.poll([P0])
    daemon.flush(early=True)
    daemon.crash()
    daemon.poll([P0])
    daemon.flush(early=True)
    output = daemon.finish()
    assert [(w.revision, w.kind, w.input_rows) for w in output.windows] == [
        (0, "delta", 1), (1, "delta", 1)]
    assert starts_ends(output.windows) == [(1, 51), (1, 51)]


# -- replay ------------------------------------------------------------------------------


def test_a_replay_skips_the_emitted_sessions_and_rebuilds_the_open_ones() -> None:
    messages = {P0: [[row("a", 1_000)], [row("b", 1_010), row("a", 1_050)],
                     [row("b", 1_190), row("c", 1_300)], [row("b", 1_380)]],
                P1: [[row("b", 1_100)], [row("c", 1_500), row("b", 1_280)]]}
    daemon = MiniDaemon(messages, gap_ms=100)
    for order in ([P0], [P0, P1], [P0, P1]):
        daemon.poll(order)
        daemon.flush()
    # Watermark 1300: a's [1000, 1150) is emitted; b's chain 1010..1280 is open.
    assert starts_ends(daemon.output.windows) == [(1_000, 1_150)]
    daemon.crash()  # P0 resumes at offset 1, with a's 1050 and b's 1010
    replay = daemon.engine
    assert replay.replaying(P0)
    output = daemon.finish()
    rows = [r for ms in messages.values() for m in ms for r in m]
    assert_frame_equal(emitted(output.windows), session_reference(rows, 100))
    assert replay.skipped_replayed_rows == 1
    assert output.late == []


@pytest.mark.parametrize("crash", [False, True])
def test_a_row_reaching_a_session_closed_within_a_gap_of_the_frontier_is_late_after_a_restart(
    crash: bool,
) -> None:
    # Watermark 1150: a's [1000, 1100) is out, z's session is open. a@1090 comes next: its
    # own session would end at 1190, after the frontier, but it would reopen a's. A
    # restart knows a's closed end only from a's replayed rows, so the commit keeps them.
    messages = {P0: [[row("a", 1_000)], [row("z", 1_150)], [row("a", 1_090, 100.0)]]}
    daemon = MiniDaemon(messages, gap_ms=100)
    for _ in range(2):
        daemon.poll([P0])
        daemon.flush()
    assert starts_ends(daemon.output.windows) == [(1_000, 1_100)]
    assert committable(daemon.engine)[P0].offset == 0
    if crash:
        daemon.crash()
    output = daemon.finish()
    [late] = output.late
    assert late.select("k", "window_start", "window_end").rows() == [("a", 1_000, 1_100)]
    kept = [r for m in messages[P0] for r in m if r[2] != 100.0]
    assert_frame_equal(emitted(output.windows), session_reference(kept, 100))


def test_once_every_partition_is_idle_the_commit_reaches_the_end_of_the_input() -> None:
    messages = {P0: [[row("a", 1_000)], [row("z", 1_150)]]}
    daemon = MiniDaemon(messages, gap_ms=100)
    for _ in range(2):
        daemon.poll([P0])
        daemon.flush()
    assert committable(daemon.engine)[P0].offset == 0  # a row could still reopen a's
    daemon.flush(daemon.now + 60_000)  # idle: z closes, nothing is left to wait for
    assert starts_ends(daemon.output.windows) == [(1_000, 1_100), (1_150, 1_250)]
    assert committable(daemon.engine)[P0].offset == 2


def test_a_late_row_in_the_last_gap_is_listed_so_a_replay_still_skips_its_session() -> None:
    # a's [1000, 1150) is emitted; the late 1120 would reopen it, and a's next session
    # starts at 1200, within a gap of it. Replayed, the three would chain into one
    # session: the commit lists a, so the replay drops its rows before 1150.
    messages = {P0: [[row("a", 1_000), row("a", 1_050), row("z", 1_000)],
                     [row("z", 1_160)], [row("a", 1_120, 100.0), row("a", 1_200)],
                     [row("z", 1_230)]]}
    daemon = MiniDaemon(messages, gap_ms=100)
    for _ in range(3):
        daemon.poll([P0])
        daemon.flush()
    assert daemon.output.late_rows() == 1
    metadata = committable(daemon.engine)[P0].metadata
    assert len(metadata.closed) == 1
    assert CommitMetadata.decode(metadata.encode()) == metadata
    daemon.crash()
    output = daemon.finish()
    assert output.late_rows() == 1  # not written again
    kept = [r for m in messages[P0] for r in m if r[2] != 100.0]
    assert_frame_equal(emitted(output.windows), session_reference(kept, 100))


def test_after_a_restart_with_nothing_to_replay_old_rows_are_late_at_once() -> None:
    engine = session_engine(gap_ms=100)
    engine.assign(P0, 2, CommitMetadata(frontier=1_500, position=2, max_event_ms=1_500), 0)
    assert not engine.replaying(P0)
    late = feed(engine, P0, 2, [row("a", 1_090)], now_ms=1)
    assert late is not None
    assert late.select("__message", "window_start", "window_end").rows() == [(0, 1_090, 1_190)]


def test_new_rows_before_the_frontier_wait_for_the_replay_then_name_their_message() -> None:
    engine = session_engine(gap_ms=100)
    engine.assign(P0, 0, CommitMetadata(frontier=2_000, position=1, max_event_ms=2_000), 0)
    engine.assign(P1, 0, CommitMetadata(frontier=2_000, position=2, max_event_ms=2_050), 0)
    new = [row("a", 1_500, 7.0)]  # before the frontier: it waits for P1's replay
    assert feed(engine, P0, 0, [row("x", 1_850)], now_ms=1) is None  # P0's replay is over
    assert feed(engine, P0, 1, new, now_ms=2) is None
    assert engine.open_window_count() == 2
    assert feed(engine, P1, 0, [row("y", 1_990)], now_ms=3) is None
    late = feed(engine, P1, 1, [row("y", 2_050)], now_ms=4)  # P1's replay ends here
    assert late is not None
    records = late_records(late, [ref(P1, 1, [row("y", 2_050)])], topic="late",
                           compression="none", max_bytes=10**6)
    (record,) = records
    origin = {k: v for k, v in record.headers if k.startswith("arrowagg.late.original")}
    assert origin == {"arrowagg.late.original-topic": b"events",
                      "arrowagg.late.original-partition": b"0",
                      "arrowagg.late.original-offset": b"1"}
    assert engine.skipped_replayed_rows == 1  # x's [1850, 1950) was emitted before
    closed = engine.close_due(10**9)
    assert_frame_equal(emitted(closed), session_reference([row("y", 1_990), row("y", 2_050)],
                                                          100))


def test_rows_that_waited_in_a_replay_are_new_again_after_another_crash() -> None:
    # c's row at P0@2 is new after the first crash and before the frontier (1200): it
    # waits for P1's replay. Two more crashes come before that replay ends; each time
    # the commit says the row was never taken (``waiting``), so it is still reported late
    # once, rather than counted among the replayed rows of an emitted session.
    messages = {P0: [[row("a", 1_000)], [row("a", 1_200)], [row("c", 1_000)]],
                P1: [[row("b", 1_000)], [row("b", 1_300)]]}
    daemon = MiniDaemon(messages, gap_ms=100)
    daemon.poll([P0, P1])
    daemon.flush()
    daemon.poll([P0, P1])
    daemon.flush()  # watermark 1200: a's and b's first sessions are emitted
    daemon.crash()
    daemon.poll([P0, P0])  # P0@1 replayed, P0@2 new: it waits
    daemon.flush()
    assert committable(daemon.engine)[P0].metadata.waiting == 2
    daemon.crash()
    daemon.poll([P0])  # P0@1 again; P0@2 not read yet in this run
    daemon.flush()
    assert committable(daemon.engine)[P0].metadata.waiting == 2
    daemon.crash()
    output = daemon.finish()
    assert output.late_rows() == 1
    assert_frame_equal(emitted(output.windows), session_reference(
        [r for ms in messages.values() for m in ms for r in m if r[0] != "c"], 100))


def test_too_many_listed_keys_emit_the_open_sessions_early() -> None:
    engine = session_engine(gap_ms=100)
    engine.assign(P0, None, None, now_ms=0)
    keys = [f"k{i}" for i in range(MAX_LISTED_KEYS + 1)]
    feed(engine, P0, 0, [row(k, 1_000) for k in keys], now_ms=1)
    feed(engine, P0, 1, [row("open", 1_150), row("open", 1_100)], now_ms=2)
    assert len(engine.close_due(2)) == 1  # watermark 1150: every k closes at 1100
    late = feed(engine, P0, 2, [row(k, 1_090) for k in keys], now_ms=3)
    assert late is not None
    assert late.height == len(keys)
    assert len(committable(engine)[P0].metadata.closed) == len(keys)
    revisions = engine.close_due(3)
    assert [(w.final, w.input_rows) for w in revisions] == [(False, 2)]
    point = committable(engine)[P0]
    # A delta went out: the commit says how far numbering went (provisional.py).
    assert point == CommitPoint(3, CommitMetadata(frontier=1_150, position=3,
                                                  max_event_ms=1_150, revisions_through=0))


def test_event_time_sessions_need_the_time_column() -> None:
    with pytest.raises(ValueError, match="event-time sessions need"):
        SessionWindowEngine(PROCESSING_PLAN, SessionSpec(10), event_time=True,
                            time_dtype=None, allowed_lateness_ms=0, idle_timeout_ms=1)
    with pytest.raises(ValueError, match="gap_ms must be positive"):
        SessionSpec(0)
