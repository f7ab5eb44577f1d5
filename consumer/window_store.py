"""Open windows' partial aggregates: memory grows with groups, never with rows.

Each batch arrives already pre-aggregated (one partial per batch, from
``PartialAggregator.partial``). Partials wait in a short list and are merged into the
state every ``merge_every`` batches rather than on every batch: re-aggregating the whole
state per batch would cost O(groups) each time for no gain.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from consumer.aggregate import PartialAggregator

WINDOW_START = "window_start"
WINDOW_END = "window_end"
ROWS = "__rows"


@dataclass(frozen=True)
class ClosedWindow:
    """One window's result: ``frame`` has window_start, window_end, keys, aggregates,
    row_count. ``final`` is False for an early revision (the memory budget was reached):
    each revision covers the rows since the previous one."""

    start_ms: int
    end_ms: int
    frame: pl.DataFrame
    input_rows: int
    final: bool = True
    revision: int = 0


class WindowStore:
    def __init__(self, aggregator: PartialAggregator, *, merge_every: int) -> None:
        self._aggregator = aggregator
        self._merge_every = merge_every
        self._pending: list[pl.DataFrame] = []
        self._state: pl.DataFrame | None = None
        self._ends: dict[int, int] = {}  # open window start -> end

    def add(self, partial: pl.DataFrame, ends: dict[int, int]) -> None:
        """Add one batch's partial state; ``ends`` maps each window start it holds to its end."""
        if partial.height == 0:
            return
        self._pending.append(partial)
        self._ends.update(ends)
        if len(self._pending) >= self._merge_every:
            self._merge()

    def open_windows(self) -> dict[int, int]:
        return dict(self._ends)

    def cardinality(self) -> int:
        """Groups held across open windows (an upper bound until pending partials merge)."""
        held = 0 if self._state is None else self._state.height
        return held + sum(p.height for p in self._pending)

    def pop_closed(self, frontier_ms: int | None) -> list[ClosedWindow]:
        """Remove and return every window whose end is at or below ``frontier_ms``."""
        if frontier_ms is None:
            return []
        due = sorted(start for start, end in self._ends.items() if end <= frontier_ms)
        return self._pop(due)

    def pop_all(self) -> list[ClosedWindow]:
        return self._pop(sorted(self._ends))

    def discard(self) -> None:
        """Forget every open window (after an aborted transaction or a revoke)."""
        self._pending.clear()
        self._state = None
        self._ends.clear()

    def _merge(self) -> None:
        parts = self._pending if self._state is None else [self._state, *self._pending]
        self._state = self._aggregator.merge(parts)
        self._pending = []

    def _pop(self, starts: list[int]) -> list[ClosedWindow]:
        if not starts:
            return []
        parts = self._pending if self._state is None else [self._state, *self._pending]
        if len(starts) == len(self._ends):  # every open window closes
            closing = self._aggregator.merge(parts)
            self._state, self._pending = None, []
        else:
            # Merge only the closing windows' rows. The open windows' rows stay as they
            # are (the state still merged, the partials still pending) rather than being
            # re-aggregated at every close.
            due = pl.col(WINDOW_START).is_in(starts)
            closing = self._aggregator.merge([p.filter(due) for p in parts])
            kept = [p.filter(~due) for p in parts]
            if self._state is not None:
                self._state, kept = kept[0], kept[1:]
            self._pending = [p for p in kept if p.height]
        results = self._aggregator.finalize(closing)
        if len(starts) == 1:  # the usual case: no need to split (and copy) the result
            by_start = {(starts[0],): results} if results.height else {}
        else:
            by_start = results.partition_by(WINDOW_START, as_dict=True, maintain_order=False)
        closed = []
        for (start,), frame in by_start.items():
            end = self._ends.pop(int(start))
            closed.append(_closed(int(start), end, frame))
        for start in starts:
            self._ends.pop(start, None)  # a window whose groups were all empty
        return sorted(closed, key=lambda w: w.start_ms)


def _closed(start_ms: int, end_ms: int, frame: pl.DataFrame) -> ClosedWindow:
    window_cols = [
        pl.lit(start_ms, pl.Int64).cast(pl.Datetime("ms", "UTC")).alias(WINDOW_START),
        pl.lit(end_ms, pl.Int64).cast(pl.Datetime("ms", "UTC")).alias(WINDOW_END),
    ]
    rest = [c for c in frame.columns if c != WINDOW_START]
    result = frame.select(*window_cols, *rest)
    return ClosedWindow(start_ms, end_ms, result, int(result["row_count"].sum()))
