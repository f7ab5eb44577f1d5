"""Open windows' partial aggregates: memory grows with groups, never with rows.

Each batch arrives already pre-aggregated (one partial per batch, from
``PartialAggregator.partial``). Partials wait in a short list and are merged into the
state every ``merge_every`` batches rather than on every batch: re-aggregating the whole
state per batch would cost O(groups) each time for no gain. They are merged sooner once
they hold more rows than the state and at least ``_MERGE_FROM_PENDING_ROWS``: at high
cardinality each partial is nearly as large as its batch (often not grouped at all), and
eight of them held ~6x the state's memory (1M groups: 1.5 GB peak).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import polars as pl

from consumer.core.aggregate import PartialAggregator
from consumer.core.types import WINDOW_END, WINDOW_START, ClosedWindow

# Below this many pending rows the merge cadence alone decides (a merge has a fixed cost).
_MERGE_FROM_PENDING_ROWS = 200_000


@dataclass(frozen=True)
class _Part:
    """A state frame, the window starts it holds rows of, and whether it is grouped
    (each group at most once) or still holds ungrouped row states."""

    frame: pl.DataFrame
    starts: frozenset[int]
    grouped: bool

    def split(self, due: frozenset[int]) -> tuple[_Part | None, _Part | None]:
        """(its rows of the ``due`` windows, its other rows); filters only when mixed."""
        if self.starts <= due:
            return self, None
        if self.starts.isdisjoint(due):
            return None, self
        closing = pl.col(WINDOW_START).is_in(sorted(due & self.starts))
        return (_Part(self.frame.filter(closing), self.starts & due, self.grouped),
                _Part(self.frame.filter(~closing), self.starts - due, self.grouped))


class WindowStore:
    def __init__(self, aggregator: PartialAggregator, *, merge_every: int) -> None:
        self._aggregator = aggregator
        self._merge_every = merge_every
        self._pending: list[_Part] = []
        self._state: _Part | None = None
        self._ends: dict[int, int] = {}  # open window start -> end

    def add(self, partial: pl.DataFrame, ends: dict[int, int]) -> None:
        """Add the partial state that the aggregator's partial() has just returned;
        ``ends`` maps each window start it holds to its end."""
        if partial.height == 0:
            return
        grouped = self._aggregator.last_partial_grouped
        self._pending.append(_Part(partial, frozenset(ends), grouped))
        self._ends.update(ends)
        pending_rows = sum(p.frame.height for p in self._pending)
        state_rows = 0 if self._state is None else self._state.frame.height
        if (len(self._pending) >= self._merge_every
                or pending_rows >= max(state_rows, _MERGE_FROM_PENDING_ROWS)):
            self._merge()

    def open_windows(self) -> dict[int, int]:
        return dict(self._ends)

    def cardinality(self) -> int:
        """Groups held across open windows (an upper bound until pending partials merge)."""
        return sum(p.frame.height for p in self._parts())

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

    def _parts(self) -> list[_Part]:
        return self._pending if self._state is None else [self._state, *self._pending]

    def _merge(self) -> None:
        self._state = _merged(self._aggregator, self._parts())
        self._pending = []

    def _pop(self, starts: list[int]) -> list[ClosedWindow]:
        if not starts:
            return []
        # Only the closing windows' rows are merged. The open windows' rows stay as they
        # are (the state still merged, the partials still pending) rather than being
        # re-aggregated at every close; a part is filtered only if it holds both kinds.
        due = frozenset(starts)
        closing: list[_Part] = []
        state, self._state = self._state, None
        if state is not None:
            closed_part, self._state = state.split(due)
            closing += [closed_part] if closed_part is not None else []
        kept = []
        for part in self._pending:
            closed_part, open_part = part.split(due)
            closing += [closed_part] if closed_part is not None else []
            kept += [open_part] if open_part is not None and open_part.frame.height else []
        self._pending = kept
        results = self._aggregator.finalize(_merged(self._aggregator, closing).frame)
        self._compact_keys()
        return self._closed_windows(starts, results)

    def _compact_keys(self) -> None:
        parts = self._parts()
        frames = self._aggregator.compact_keys([p.frame for p in parts])
        if frames is None:
            return
        renewed = [replace(p, frame=f) for p, f in zip(parts, frames, strict=True)]
        if self._state is not None:
            self._state, *renewed = renewed
        self._pending = renewed

    def _closed_windows(self, starts: list[int], results: pl.DataFrame) -> list[ClosedWindow]:
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


def _merged(aggregator: PartialAggregator, parts: list[_Part]) -> _Part:
    """One grouped part from ``parts`` (in arrival order)."""
    regroup = not all(p.grouped for p in parts)
    frame = aggregator.merge([p.frame for p in parts], regroup=regroup)
    return _Part(frame, frozenset().union(*(p.starts for p in parts)), grouped=True)


def _closed(start_ms: int, end_ms: int, frame: pl.DataFrame) -> ClosedWindow:
    window_cols = [
        pl.lit(start_ms, pl.Int64).cast(pl.Datetime("ms", "UTC")).alias(WINDOW_START),
        pl.lit(end_ms, pl.Int64).cast(pl.Datetime("ms", "UTC")).alias(WINDOW_END),
    ]
    rest = [c for c in frame.columns if c != WINDOW_START]
    result = frame.select(*window_cols, *rest)
    return ClosedWindow(start_ms, end_ms, result, int(result["row_count"].sum()))
