"""Rows from the future are taken out before they can move a watermark; committed
progress from the future is not restored."""

from __future__ import annotations

import pyarrow as pa
import pytest

from consumer.core.decode import DecodedMessage
from consumer.core.future_rows import split_future, without_future_progress
from consumer.core.offsets import CommitMetadata

BOUND_MS = 1_800_000_000_000  # 2027-01-15


def decoded(ts: pa.Array) -> DecodedMessage:
    table = pa.table({"k": [f"k{i}" for i in range(len(ts))], "ts": ts})
    return DecodedMessage(table, None, 10**18)  # the range is not trusted: recomputed


@pytest.mark.parametrize(("unit", "per_ms"), [("s", None), ("ms", 1), ("us", 1_000),
                                              ("ns", 1_000_000)])
def test_rows_after_the_bound_are_split_off_in_every_unit(unit: str, per_ms: int | None) -> None:
    def raw(ms: int) -> int:
        return ms // 1_000 if per_ms is None else ms * per_ms

    at_bound = raw(BOUND_MS)
    values = [raw(BOUND_MS - 5_000), at_bound, raw(7_258_118_400_000), raw(BOUND_MS + 1_000)]
    kept, future = split_future(decoded(pa.array(values, pa.timestamp(unit, "UTC"))), "ts",
                                BOUND_MS)
    assert kept.table.column("k").to_pylist() == ["k0", "k1"]
    assert future.column("k").to_pylist() == ["k2", "k3"]  # 2200-01-01, and a second past
    assert kept.min_event_ms == BOUND_MS - 5_000
    assert kept.max_event_ms == BOUND_MS


def test_a_millisecond_past_the_bound_is_future_below_a_millisecond_is_not() -> None:
    ns = pa.array([BOUND_MS * 1_000_000 + 999_999, (BOUND_MS + 1) * 1_000_000],
                  pa.timestamp("ns"))
    kept, future = split_future(decoded(ns), "ts", BOUND_MS)
    assert kept.table.num_rows == 1
    assert future.num_rows == 1


def test_integer_epoch_milliseconds() -> None:
    kept, future = split_future(decoded(pa.array([1, BOUND_MS + 1], pa.int64())), "ts",
                                BOUND_MS)
    assert (kept.min_event_ms, kept.max_event_ms) == (1, 1)
    assert future.column("ts").to_pylist() == [BOUND_MS + 1]


def test_all_rows_from_the_future_leave_an_empty_message_without_a_time_range() -> None:
    kept, future = split_future(decoded(pa.array([BOUND_MS + 1], pa.int64())), "ts", BOUND_MS)
    assert kept.table.num_rows == 0
    assert (kept.min_event_ms, kept.max_event_ms) == (None, None)
    assert future.num_rows == 1


def test_poisoned_committed_progress_is_dropped_and_the_rest_kept() -> None:
    poisoned = CommitMetadata(frontier=7_258_118_400_000, position=42,
                              max_event_ms=7_258_118_400_000)
    assert without_future_progress(poisoned, BOUND_MS) == CommitMetadata(None, 42, None)
    half = CommitMetadata(frontier=BOUND_MS - 1, position=7, max_event_ms=BOUND_MS + 1)
    assert without_future_progress(half, BOUND_MS) == CommitMetadata(BOUND_MS - 1, 7, None)
    sound = CommitMetadata(frontier=BOUND_MS, position=7, max_event_ms=BOUND_MS)
    assert without_future_progress(sound, BOUND_MS) is sound
    assert without_future_progress(None, BOUND_MS) is None
