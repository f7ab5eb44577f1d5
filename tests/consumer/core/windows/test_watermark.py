from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from consumer.core.windows.watermark import Watermark, WatermarkTracker

P0 = ("events", 0)
P1 = ("events", 1)
P2 = ("events", 2)


def tracker(lateness_ms: int = 0, idle_timeout_ms: int = 10_000) -> WatermarkTracker:
    return WatermarkTracker(allowed_lateness_ms=lateness_ms, idle_timeout_ms=idle_timeout_ms)


def test_no_partitions_is_all_idle() -> None:
    assert tracker().current(0) == Watermark(value_ms=None, all_idle=True)


def test_single_partition_is_its_largest_event_time() -> None:
    marks = tracker()
    marks.assign(P0, now_ms=0, max_event_ms=None)
    marks.observe(P0, 5_000, now_ms=1)
    marks.observe(P0, 3_000, now_ms=2)  # out of order: the maximum stays
    assert marks.current(3) == Watermark(value_ms=5_000, all_idle=False)
    assert marks.max_event_ms(P0) == 5_000


def test_minimum_over_partitions() -> None:
    marks = tracker()
    for partition in (P0, P1, P2):
        marks.assign(partition, now_ms=0, max_event_ms=None)
    marks.observe(P0, 9_000, now_ms=1)
    marks.observe(P1, 4_000, now_ms=1)
    marks.observe(P2, 7_000, now_ms=1)
    assert marks.current(2) == Watermark(value_ms=4_000, all_idle=False)
    marks.observe(P1, 8_000, now_ms=3)
    assert marks.current(4).value_ms == 7_000


def test_lateness_is_subtracted() -> None:
    marks = tracker(lateness_ms=1_500)
    marks.assign(P0, now_ms=0, max_event_ms=None)
    marks.assign(P1, now_ms=0, max_event_ms=None)
    marks.observe(P0, 10_000, now_ms=1)
    marks.observe(P1, 6_000, now_ms=1)
    assert marks.current(2) == Watermark(value_ms=4_500, all_idle=False)


def test_observe_without_event_time_keeps_the_maximum() -> None:
    marks = tracker()
    marks.assign(P0, now_ms=0, max_event_ms=None)
    marks.observe(P0, 2_000, now_ms=1)
    marks.observe(P0, None, now_ms=2)  # an empty or rejected message
    assert marks.max_event_ms(P0) == 2_000
    assert marks.current(3).value_ms == 2_000


def test_partition_without_data_holds_the_watermark_until_idle() -> None:
    marks = tracker(idle_timeout_ms=1_000)
    marks.assign(P0, now_ms=100, max_event_ms=None)
    marks.assign(P1, now_ms=100, max_event_ms=None)
    marks.observe(P0, 5_000, now_ms=200)
    assert marks.current(200) == Watermark(value_ms=None, all_idle=False)
    # Idle is measured from the stream's first message (not from the assignment: P1 may
    # be fetched a poll after P0): held through 1199, released at 1200.
    assert marks.current(1_199) == Watermark(value_ms=None, all_idle=False)
    marks.observe(P0, 6_000, now_ms=1_150)
    assert marks.current(1_200) == Watermark(value_ms=6_000, all_idle=False)


def test_idle_partition_stops_holding_the_watermark_back() -> None:
    marks = tracker(idle_timeout_ms=1_000)
    marks.assign(P0, now_ms=0, max_event_ms=None)
    marks.assign(P1, now_ms=0, max_event_ms=None)
    marks.observe(P0, 1_000, now_ms=0)  # the slow partition
    marks.observe(P1, 9_000, now_ms=0)
    assert marks.current(500).value_ms == 1_000
    marks.observe(P1, 9_500, now_ms=800)
    assert marks.current(999).value_ms == 1_000
    assert marks.current(1_000) == Watermark(value_ms=9_500, all_idle=False)
    # When the slow partition speaks again it holds the watermark once more.
    marks.observe(P0, 2_000, now_ms=1_200)
    assert marks.current(1_300).value_ms == 2_000


def test_all_partitions_idle() -> None:
    marks = tracker(idle_timeout_ms=1_000)
    marks.assign(P0, now_ms=0, max_event_ms=None)
    marks.assign(P1, now_ms=0, max_event_ms=None)
    marks.observe(P0, 1_000, now_ms=100)
    marks.observe(P1, 2_000, now_ms=400)
    assert marks.current(1_399).all_idle is False
    assert marks.current(1_400) == Watermark(value_ms=None, all_idle=True)


def test_assign_restores_progress_after_a_restart() -> None:
    marks = tracker(lateness_ms=100)
    marks.assign(P0, now_ms=0, max_event_ms=7_000)
    assert marks.max_event_ms(P0) == 7_000
    assert marks.current(1).value_ms == 6_900
    marks.observe(P0, 6_000, now_ms=2)  # older than the restored maximum
    assert marks.max_event_ms(P0) == 7_000


def test_revoke_forgets_the_partition() -> None:
    marks = tracker()
    marks.assign(P0, now_ms=0, max_event_ms=None)
    marks.assign(P1, now_ms=0, max_event_ms=None)
    marks.observe(P0, 1_000, now_ms=1)
    marks.observe(P1, 8_000, now_ms=1)
    marks.revoke(P0)
    assert marks.max_event_ms(P0) is None
    assert marks.current(2).value_ms == 8_000
    marks.revoke(P1)
    assert marks.current(2) == Watermark(value_ms=None, all_idle=True)
    marks.revoke(P1)  # revoking twice is harmless
    assert marks.current(3).all_idle is True


def test_revoked_partition_without_data_stops_holding() -> None:
    marks = tracker()
    marks.assign(P0, now_ms=0, max_event_ms=None)
    marks.assign(P1, now_ms=0, max_event_ms=None)
    marks.observe(P0, 3_000, now_ms=1)
    assert marks.current(2).value_ms is None
    marks.revoke(P1)
    assert marks.current(2).value_ms == 3_000


def test_unknown_partition_is_tracked_on_first_message() -> None:
    marks = tracker()
    marks.observe(P2, 4_000, now_ms=10)
    assert marks.max_event_ms(P2) == 4_000
    assert marks.current(11) == Watermark(value_ms=4_000, all_idle=False)


@given(
    events=st.lists(
        st.tuples(st.integers(0, 2), st.integers(-(10**12), 10**12)), min_size=1, max_size=50
    ),
    lateness=st.integers(0, 10**6),
)
def test_watermark_is_min_of_maxima_minus_lateness(
    events: list[tuple[int, int]], lateness: int
) -> None:
    marks = tracker(lateness_ms=lateness)
    maxima: dict[int, int] = {}
    for partition, event_ms in events:
        marks.observe(("t", partition), event_ms, now_ms=0)
        maxima[partition] = max(maxima.get(partition, event_ms), event_ms)
    assert marks.current(0) == Watermark(min(maxima.values()) - lateness, all_idle=False)


def test_partitions_ahead_of_the_slowest_live_one() -> None:
    tracker = WatermarkTracker(allowed_lateness_ms=0, idle_timeout_ms=1_000)
    tracker.observe(P0, 5_000, now_ms=0)
    tracker.observe(P1, 2_000, now_ms=0)
    tracker.observe(P2, 5_000, now_ms=900)
    assert tracker.ahead(now_ms=900) == [P0, P2]
    assert tracker.ahead(now_ms=1_000) == []  # only P2 is live: nothing to be ahead of


def test_every_partition_with_data_is_ahead_of_one_without() -> None:
    tracker = WatermarkTracker(allowed_lateness_ms=0, idle_timeout_ms=1_000)
    tracker.assign(P0, 0, None)
    tracker.observe(P1, 2_000, now_ms=0)
    assert tracker.ahead(now_ms=0) == [P1]


def test_a_stream_resuming_after_a_pause_waits_for_every_partition_again() -> None:
    tracker = WatermarkTracker(allowed_lateness_ms=0, idle_timeout_ms=1_000)
    for partition in (P0, P1):
        tracker.assign(partition, 0, None)
        tracker.observe(partition, 800, now_ms=0)
    assert tracker.current(5_000).all_idle  # a pause: both idle
    tracker.observe(P1, 1_600, now_ms=5_000)  # P1's part of the next chunk comes first
    watermark = tracker.current(5_000)
    assert watermark.value_ms == 800, "P0 is about to bring rows of the same windows"
    assert not tracker.idle(P0, 5_999)
    tracker.observe(P1, 1_700, now_ms=5_900)
    assert tracker.current(6_000).value_ms == 1_700  # P0 silent a whole timeout: idle again


def test_a_partition_taken_over_mid_pause_resumes_the_stream_after_its_replay() -> None:
    """P1 is taken over while P0 is idle; its replay moves P1 only, and its first new
    message gives P0 its timeout again: P0's part of the same chunk is coming."""
    tracker = WatermarkTracker(allowed_lateness_ms=0, idle_timeout_ms=1_000)
    tracker.assign(P0, 0, None)
    tracker.observe(P0, 1_600, now_ms=0)
    tracker.assign(P1, 5_000, None)  # taken over from another instance
    tracker.observe(P1, 1_599, now_ms=5_050, replayed=True)
    assert tracker.idle(P0, 5_050), "a replay is no resumption"
    tracker.observe(P1, 2_400, now_ms=5_600)  # P1's part of the next chunk
    assert not tracker.idle(P0, 5_600)
    assert tracker.current(5_600).value_ms == 1_600, "P0 holds the windows it brings rows to"
    tracker.observe(P1, 2_500, now_ms=6_500)
    assert tracker.current(6_600).value_ms == 2_500  # P0 silent a whole timeout: idle again


def test_a_resumed_partition_delivering_keeps_the_others_idle() -> None:
    tracker = WatermarkTracker(allowed_lateness_ms=0, idle_timeout_ms=1_000)
    tracker.observe(P0, 1_000, now_ms=0)
    tracker.observe(P1, 5_000, now_ms=0)
    for now_ms in range(100, 3_000, 100):
        tracker.observe(P1, 5_000 + now_ms, now_ms=now_ms)
    assert tracker.idle(P0, 2_900)
    assert tracker.current(2_900).value_ms == 7_900


def test_a_backlog_resumes_an_idle_stream_but_a_held_back_partition_does_not() -> None:
    tracker = WatermarkTracker(allowed_lateness_ms=0, idle_timeout_ms=1_000)
    tracker.observe(P0, 1_000, now_ms=0)
    tracker.observe(P1, 1_000, now_ms=0)
    tracker.keep_alive(P1, now_ms=5_000)  # every partition idle: the stream resumes
    assert not tracker.idle(P0, 5_000)
    # A partition assigned and not resumed yet (replaying, or paused) keeps a backlog for
    # as long as it waits: P0 goes idle all the same, or the two would wait on each other.
    tracker.assign(P2, 7_000, None)
    for now_ms in range(7_000, 9_000, 100):
        tracker.keep_alive(P2, now_ms)
        tracker.observe(P1, 2_000, now_ms=now_ms)
    assert tracker.idle(P0, 8_900)
