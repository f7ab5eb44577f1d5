"""Open windows' partial aggregates: memory grows with groups, never with rows.

Each batch arrives already pre-aggregated (one partial per batch, from
``PartialAggregator.partial``) and is kept per window: a closing window's parts are
merged once, with no filtering of rows that belong to windows still open. A window's
partials wait in a short list and are merged into its state every ``merge_every``
batches rather than on every batch: re-aggregating the whole state per batch would cost
O(groups) each time for no gain. They are merged sooner once two or more of them hold
more rows than the state (and at least ``_MERGE_FROM_PENDING_ROWS``): at high
cardinality each partial is nearly as large as its batch (often not grouped at all), and
eight of them held ~6x the state's memory (1M groups: 1.5 GB peak RSS).

A plan with aggregates that do not decompose also keeps, per window, the rows of the
columns they read (consumer/core/holistic.py); they are aggregated once, at close.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import polars as pl

from consumer.core.aggregate import PartialAggregator
from consumer.core.holistic import ValueBuffer
from consumer.core.types import ROW_COUNT, ROWS, WINDOW_END, WINDOW_START, ClosedWindow

# Below this many pending rows the merge cadence alone decides (a merge has a fixed cost).
_MERGE_FROM_PENDING_ROWS = 200_000
# A single pending partial is never merged early: in a window that closes soon its rows
# would be grouped twice.
_MERGE_FROM_PENDING_PARTS = 2


@dataclass(frozen=True)
class _Part:
    """A state frame, and whether it is grouped (each group at most once) or still holds
    ungrouped row states."""

    frame: pl.DataFrame
    grouped: bool


@dataclass
class _Window:
    end: int
    state: _Part | None = None
    pending: list[_Part] = field(default_factory=list)
    values: list[pl.DataFrame] = field(default_factory=list)  # buffered rows, if any
    changed: list[pl.DataFrame] = field(default_factory=list)  # groups since a provisional

    def parts(self) -> list[_Part]:
        """In arrival order (first/last depend on it)."""
        return self.pending if self.state is None else [self.state, *self.pending]

    def rows(self) -> int:
        return sum(p.frame.height for p in self.parts())


class WindowStore:
    def __init__(self, aggregator: PartialAggregator, *, merge_every: int,
                 finalize: bool = True, track_changes: bool = False) -> None:
        """``finalize``: closed windows hold results; otherwise they hold the merged
        partial state itself (stage 1 of the scale-out sends it on to be merged).
        ``track_changes``: note the groups each batch changes, for ``provisional``."""
        self._aggregator = aggregator
        self._merge_every = merge_every
        self._finalize = finalize
        self._track_changes = track_changes
        self._windows: dict[int, _Window] = {}  # by start
        self._values = ValueBuffer.for_plan(aggregator.plan, aggregator.group_by)

    def add_values(self, start: int, end: int, values: pl.DataFrame) -> None:
        """Buffered rows of the window at ``start`` without a partial state (stage 2 of
        the scale-out gets them apart from the state they go with)."""
        if self._values is None:
            raise ValueError("this plan buffers no values")
        self._windows.setdefault(start, _Window(end)).values.append(values)

    def add(self, partial: pl.DataFrame, ends: dict[int, int], *,
            grouped: bool | None = None, rows: pl.LazyFrame | None = None,
            values: dict[int, list[pl.DataFrame]] | None = None) -> None:
        """Add a partial state; ``ends`` maps each window start it holds to its end.
        ``grouped`` (each group at most once): by default, whether the aggregator's last
        partial() grouped its batch, for the state it has just returned. When the plan
        buffers values: ``rows``, the batch the partial came from, or ``values``, the
        buffered rows themselves by window (as ``take`` gives them)."""
        if partial.height == 0:
            return
        if grouped is None:
            grouped = self._aggregator.last_partial_grouped
        buffered = values if values is not None else self._buffered(rows, ends)
        for start, frame in _by_window(partial, ends):
            window = self._windows.setdefault(start, _Window(ends[start]))
            window.pending.append(_Part(frame, grouped))
            window.values += buffered.get(start, [])
            if self._track_changes:
                window.changed.append(self._aggregator.group_keys(frame))
            if self._merge_due(window):
                window.state = _merged(self._aggregator, window.parts())
                window.pending = []

    def _buffered(self, rows: pl.LazyFrame | None, ends: dict[int, int],
                  ) -> dict[int, list[pl.DataFrame]]:
        if self._values is None:
            return {}
        if rows is None:
            raise ValueError("this plan buffers values: add() needs the batch's rows")
        return {start: [frame] for start, frame in _by_window(self._values.take(rows), ends)}

    def _merge_due(self, window: _Window) -> bool:
        if len(window.pending) >= self._merge_every:
            return True
        if len(window.pending) < _MERGE_FROM_PENDING_PARTS:
            return False
        state_rows = 0 if window.state is None else window.state.frame.height
        pending_rows = sum(p.frame.height for p in window.pending)
        return pending_rows >= max(state_rows, _MERGE_FROM_PENDING_ROWS)

    def merge_pending(self) -> None:
        """Merge every window's pending partials into its state, so that ``cardinality``
        counts each group once: the memory budget asks before it emits windows early."""
        for window in self._windows.values():
            if len(window.parts()) > 1 or any(not p.grouped for p in window.pending):
                window.state = _merged(self._aggregator, window.parts())
                window.pending = []

    def open_windows(self) -> dict[int, int]:
        return {start: window.end for start, window in self._windows.items()}

    def cardinality(self) -> int:
        """Groups held across open windows (an upper bound until pending partials merge)."""
        return sum(window.rows() for window in self._windows.values())

    def buffered_values(self) -> int:
        """Values buffered for aggregates that do not decompose (0: none do)."""
        if self._values is None:
            return 0
        return self._values.count([v for w in self._windows.values() for v in w.values])

    def pop_closed(self, frontier_ms: int | None) -> list[ClosedWindow]:
        """Remove and return every window whose end is at or below ``frontier_ms``."""
        return self.results(self.take_closed(frontier_ms))

    def pop_all(self) -> list[ClosedWindow]:
        return self.results(self.take(sorted(self._windows)))

    def take_closed(self, frontier_ms: int | None) -> Taken:
        """Remove every window whose end is at or below ``frontier_ms``; their state."""
        if frontier_ms is None:
            return self.take([])
        return self.take(sorted(s for s, w in self._windows.items() if w.end <= frontier_ms))

    def take(self, starts: list[int]) -> Taken:
        """Remove the windows starting at ``starts``: their merged state and buffered rows
        (``results`` makes them results)."""
        closing = [self._windows.pop(start) for start in starts]
        ends = {start: window.end for start, window in zip(starts, closing, strict=True)}
        # One merge for all closing windows: their rows never share a group.
        parts = [part for window in closing for part in window.parts()]
        merged = _merged(self._aggregator, parts).frame if parts else None
        if closing:
            self._compact_keys()
        return Taken(ends, merged, {s: w.values for s, w in zip(starts, closing, strict=True)})

    def results(self, taken: Taken) -> list[ClosedWindow]:
        """Taken windows as closed windows: results, or (``finalize=False``) states."""
        if taken.state is None:
            return []
        if not self._finalize:  # the state, and the buffered rows, to be finished elsewhere
            exported = self._aggregator.export_state(taken.state)
            closed = _closed_windows(taken.ends, exported, _closed_state)
            if self._values is None:
                return closed
            return [replace(w, values=self._values.export(taken.values.get(w.start_ms, [])))
                    for w in closed]
        results = self._aggregator.finalize(taken.state)
        if self._values is not None:
            results = self._values.attach(results, taken.all_values())
        return _closed_windows(taken.ends, results, _closed)

    def peek(self, start: int, groups: pl.DataFrame) -> ClosedWindow:
        """The results of ``groups`` (group-by columns, decoded) of the window at
        ``start``, which stays; ``input_rows`` counts the whole window's rows."""
        window = self._windows[start]
        window.state, window.pending = _merged(self._aggregator, window.parts()), []
        state = window.state.frame
        results = _only(self._aggregator.finalize(state), groups)
        if self._values is not None:
            results = self._values.attach(results, [_only(v, groups) for v in window.values])
        result = _closed(start, window.end, results)
        return replace(result, input_rows=int(state[ROWS].sum()))

    def provisional(self) -> list[ClosedWindow]:
        """The results, as of now, of the groups each window's batches changed since the
        last call (early results; the windows stay open and unchanged)."""
        out = []
        for start, window in sorted(self._windows.items()):
            if window.changed:
                groups = pl.concat(window.changed).unique(maintain_order=True)
                window.changed = []
                out.append(self.peek(start, groups))
        return out

    def discard(self) -> None:
        """Forget every open window (after an aborted transaction or a revoke)."""
        self._windows.clear()

    def _compact_keys(self) -> None:
        windows = list(self._windows.values())
        frames = self._aggregator.compact_keys(
            [p.frame for w in windows for p in w.parts()])
        if frames is None:
            return
        renewed = iter(frames)
        for window in windows:
            if window.state is not None:
                window.state = replace(window.state, frame=next(renewed))
            window.pending = [replace(p, frame=next(renewed)) for p in window.pending]


@dataclass(frozen=True)
class Taken:
    """Windows taken out of a store: ``ends`` by start, their merged ``state`` (None: no
    window) in the store's key encoding, and their buffered rows by start."""

    ends: dict[int, int]
    state: pl.DataFrame | None
    values: dict[int, list[pl.DataFrame]]

    def all_values(self) -> list[pl.DataFrame]:
        return [frame for frames in self.values.values() for frame in frames]


def _only(frame: pl.DataFrame, groups: pl.DataFrame) -> pl.DataFrame:
    """The rows of ``frame`` in ``groups`` (keys compared as ``frame`` holds them)."""
    keys = [pl.col(c).cast(frame.schema[c]) for c in groups.columns]
    return frame.join(groups.with_columns(keys), on=groups.columns, how="semi",
                      nulls_equal=True, maintain_order="left")


def _by_window(partial: pl.DataFrame, ends: dict[int, int]) -> list[tuple[int, pl.DataFrame]]:
    if len(ends) == 1:  # the usual case: no need to split (and copy) the partial
        return [(next(iter(ends)), partial)]
    by_start = partial.partition_by(WINDOW_START, as_dict=True, maintain_order=True)
    return [(int(start), frame) for (start,), frame in by_start.items()]


def _merged(aggregator: PartialAggregator, parts: list[_Part]) -> _Part:
    """One grouped part from ``parts`` (in arrival order)."""
    regroup = not all(p.grouped for p in parts)
    frame = aggregator.merge([p.frame for p in parts], regroup=regroup)
    return _Part(frame, grouped=True)


def _closed_windows(ends: dict[int, int], results: pl.DataFrame,
                    closed_window: Callable[[int, int, pl.DataFrame], ClosedWindow],
                    ) -> list[ClosedWindow]:
    if len(ends) == 1:  # the usual case: no need to split (and copy) the result
        by_start = {(next(iter(ends)),): results} if results.height else {}
    else:
        by_start = results.partition_by(WINDOW_START, as_dict=True, maintain_order=False)
    # A window whose groups were all empty gives no result.
    closed = [closed_window(int(start), ends[int(start)], frame)
              for (start,), frame in by_start.items()]
    return sorted(closed, key=lambda w: w.start_ms)


def _closed(start_ms: int, end_ms: int, frame: pl.DataFrame) -> ClosedWindow:
    window_cols = [
        pl.lit(start_ms, pl.Int64).cast(pl.Datetime("ms", "UTC")).alias(WINDOW_START),
        pl.lit(end_ms, pl.Int64).cast(pl.Datetime("ms", "UTC")).alias(WINDOW_END),
    ]
    rest = [c for c in frame.columns if c != WINDOW_START]
    result = frame.select(*window_cols, *rest)
    return ClosedWindow(start_ms, end_ms, result, int(result[ROW_COUNT].sum()))


def _closed_state(start_ms: int, end_ms: int, state: pl.DataFrame) -> ClosedWindow:
    """A window's merged partial state, in its exported form (window_start epoch ms)."""
    return ClosedWindow(start_ms, end_ms, state, int(state[ROWS].sum()))
