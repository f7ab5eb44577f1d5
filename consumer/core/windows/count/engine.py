"""Count windows: a window closes after N input messages or M rows, whichever first."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import polars as pl

from consumer.core.aggregate import PartialAggregator
from consumer.core.offsets import CommitMetadata, CommitPoint, OffsetTracker
from consumer.core.plan import AggregationPlan
from consumer.core.types import (
    NO_WINDOW,
    WINDOW_END,
    WINDOW_START,
    ClosedWindow,
    MessageRef,
    PartitionKey,
)
from consumer.core.windows.revisions import RevisionNumbers
from consumer.core.windows.store import WindowStore


class CountWindowEngine:
    """A window closes after ``batches`` messages or ``rows`` rows, whichever comes first.

    Messages are never split across windows. Windows are numbered; the number plays the
    role of the window end in the offset tracking, and window_start/window_end in the
    output are the processing times of the window's first message and of its close.
    """

    def __init__(self, plan: AggregationPlan, *, batches: int | None, rows: int | None,
                 idle_timeout_ms: int, merge_every: int, provisional: bool = False) -> None:
        """``provisional``: note changed groups, for early results (``provisional``)."""
        self._aggregator = PartialAggregator(plan, (WINDOW_START, *plan.keys))
        self._store = WindowStore(self._aggregator, merge_every=merge_every,
                                  track_changes=provisional)
        self._numbers = RevisionNumbers()
        self._offsets = OffsetTracker()
        self._max_batches = batches
        self._max_rows = rows
        self._idle_timeout_ms = idle_timeout_ms
        self._window_id = 0
        self._opened_ms: int | None = None
        self._batches = 0
        self._rows = 0
        self._last_message_ms = 0
        self._last_end_ms = 0
        self._ready: list[ClosedWindow] = []
        self._ready_through: int | None = None  # last window id in _ready
        self._frontier: int | None = None  # last window id handed out by close_due
        self.late_rows = 0
        self.skipped_replayed_rows = 0

    def assign(self, partition: PartitionKey, committed: int | None,
               metadata: CommitMetadata | None, now_ms: int) -> None:
        self._offsets.assign(partition, committed)
        if metadata is not None and metadata.frontier is not None:
            self._window_id = max(self._window_id, metadata.frontier + 1)
            self._frontier = max(self._frontier or metadata.frontier, metadata.frontier)
        self._last_message_ms = now_ms

    def revoke(self, partition: PartitionKey) -> None:
        self._offsets.revoke(partition)

    def replaying(self, partition: PartitionKey) -> bool:  # noqa: ARG002
        return False

    def ahead_of_watermark(self, now_ms: int) -> list[PartitionKey]:  # noqa: ARG002
        return []  # one count window at a time: pausing a partition does not close it

    def add(self, frame: pl.DataFrame, refs: Sequence[MessageRef],
            now_ms: int) -> pl.DataFrame | None:
        """Count windows commit in message order: nothing replayed was emitted."""
        self._last_message_ms = now_ms
        row = 0
        start = 0
        for ref in refs:
            if self._opened_ms is None:
                self._opened_ms = now_ms
            self._offsets.record(ref.partition, ref.offset, self._window_id)
            self._batches += 1
            self._rows += ref.rows
            row += ref.rows
            if self._full():
                self._add_rows(frame.slice(start, row - start))
                start = row
                self._close_current(now_ms)
        self._add_rows(frame.slice(start, row - start))
        return None

    def keep_alive(self, partition: PartitionKey, now_ms: int) -> None:  # noqa: ARG002
        self._last_message_ms = now_ms

    def skip(self, partition: PartitionKey, offset: int, now_ms: int) -> None:
        self._offsets.record(partition, offset, NO_WINDOW)
        self._last_message_ms = now_ms

    def _full(self) -> bool:
        return (self._max_batches is not None and self._batches >= self._max_batches) or (
            self._max_rows is not None and self._rows >= self._max_rows)

    def _add_rows(self, rows: pl.DataFrame) -> None:
        if rows.height == 0:
            return
        windowed = rows.lazy().with_columns(pl.lit(self._window_id, pl.Int64).alias(WINDOW_START))
        self._store.add(self._aggregator.partial(windowed), {self._window_id: self._window_id},
                        rows=windowed)

    def _close_current(self, now_ms: int) -> None:
        # Several count windows can close within one millisecond: keep their time spans
        # disjoint and non-empty so each window has its own [start, end).
        start_ms, end_ms = self._bounds(now_ms)
        self._last_end_ms = end_ms
        windows = [_at(w, start_ms, end_ms) for w in self._store.pop_all()]
        self._ready += self._numbers.closing(windows)
        self._ready_through = self._window_id
        self._window_id += 1
        self._opened_ms = None
        self._batches = 0
        self._rows = 0

    def _bounds(self, now_ms: int) -> tuple[int, int]:
        opened = self._opened_ms if self._opened_ms is not None else now_ms
        start_ms = max(opened, self._last_end_ms)
        return start_ms, max(now_ms, start_ms + 1)

    def provisional(self, now_ms: int) -> list[ClosedWindow]:
        """Early results: the open window's changed groups as of now, ending now."""
        start_ms, end_ms = self._bounds(now_ms)
        windows = [_at(w, start_ms, end_ms) for w in self._store.provisional()]
        return self._numbers.provisional(windows)

    def emit_early(self, now_ms: int) -> list[ClosedWindow]:
        """Over the memory budget a count window simply closes early."""
        if self._batches:
            self._close_current(now_ms)
        return self.close_due(now_ms)

    def close_due(self, now_ms: int) -> list[ClosedWindow]:
        idle = now_ms - self._last_message_ms >= self._idle_timeout_ms
        if idle and self._batches:
            self._close_current(now_ms)
        ready, self._ready = self._ready, []
        if self._ready_through is not None:
            self._frontier = self._ready_through
        return ready

    def commit_points(self) -> dict[PartitionKey, CommitPoint]:
        points = {}
        for partition in self._offsets.partitions():
            point = self._offsets.commit_point(partition, self._frontier, None)
            if point is not None:
                points[partition] = point
        return points

    def frontiers(self, now_ms: int) -> dict[PartitionKey, tuple[int | None, bool]]:  # noqa: ARG002
        """Count windows number their windows: they report no time frontier (and the
        scale-out does not take them)."""
        return {}

    def discard(self) -> None:
        self._store.discard()
        self._ready.clear()
        self._ready_through = self._frontier
        self._opened_ms = None
        self._batches = 0
        self._rows = 0

    def cardinality(self) -> int:
        return self._store.cardinality()

    def merge_pending(self) -> None:
        self._store.merge_pending()

    def buffered_values(self) -> int:
        return self._store.buffered_values()

    def open_window_count(self) -> int:
        return 1 if self._batches else 0


def _at(window: ClosedWindow, start_ms: int, end_ms: int) -> ClosedWindow:
    """A count window's results (numbered by the window id) at its processing times."""
    frame = window.frame.with_columns(
        pl.lit(start_ms, pl.Int64).cast(pl.Datetime("ms", "UTC")).alias(WINDOW_START),
        pl.lit(end_ms, pl.Int64).cast(pl.Datetime("ms", "UTC")).alias(WINDOW_END))
    return replace(window, start_ms=start_ms, end_ms=end_ms, frame=frame)
