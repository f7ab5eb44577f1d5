"""Rows of windows their partition has already emitted, as the time engine finds them.

Only a message whose earliest row falls in a window ending at or before its partition's
frontier (consumer/core/windows/frontier.py) may hold such rows; in a steady stream that
is none. ``emitted_bounds`` says, for such a message, through which window end its rows
were emitted before a restart (a replay skips them), through which they are late, and
after which they belong to windows kept for revisions (``window.late: revise``).
``mark_messages`` puts these bounds on every row of the message, and ``sort_rows`` sorts
the rows by the window each lands in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from consumer.core.types import MESSAGE_INDEX, NO_WINDOW, WINDOW_END, WINDOW_START, MessageRef
from consumer.core.windows.bounds import WindowSpec, window_ranges
from consumer.core.windows.frontier import PartitionFrontier, later, read_before_restart

SKIP_THROUGH = "__skip_through"
LATE_THROUGH = "__late_through"
KEPT_AFTER = "__kept_after"
MARKS = (SKIP_THROUGH, LATE_THROUGH, KEPT_AFTER)

# One message's (skip_through, late_through, kept_after): see emitted_bounds.
Bounds = tuple[int, int, int]


def emitted_bounds(progress: PartitionFrontier | None, ref: MessageRef, first_ms: int | None,
                   spec: WindowSpec, *, revising: bool,
                   open_within_ms: int | None = None) -> Bounds | None:
    """``(skip_through, late_through, kept_after)`` when the message may hold rows of
    windows its partition emitted: rows in windows ending at or before
    ``skip_through`` were emitted before a restart (skipped, or with late: revise
    rebuilding kept windows ending after ``kept_after``), up to ``late_through`` they
    are late (revising the kept windows ending after ``kept_after``).

    ``progress``: the message's partition's; ``first_ms``: the time of its earliest row;
    ``revising``: emitted windows are kept for revisions (late: revise);
    ``open_within_ms``: instead, windows ending within this of the frontier are open to
    revisions elsewhere (stage 1 of the scale-out: late_partials.py)."""
    if progress is None or progress.frontier is None:
        return None
    replayed = read_before_restart(progress, ref.offset)
    skip_through = progress.replayed_frontier if replayed else None
    through = later(progress.frontier, skip_through)
    if through is None or first_ms is None or _first_end(first_ms, spec) > through:
        return None
    kept_after = progress.kept_after if revising else through
    if open_within_ms is not None:
        kept_after = progress.frontier - open_within_ms
    return ((NO_WINDOW if skip_through is None else skip_through), through,
            NO_WINDOW if kept_after is None else kept_after)


def mark_messages(frame: pl.DataFrame, refs: Sequence[MessageRef],
                  bounds: Sequence[Bounds | None]) -> pl.DataFrame:
    """``frame`` (the rows of ``refs``, in order) with its message's bounds (``MARKS``;
    ``NO_WINDOW`` for a message without) and index in ``refs`` (``MESSAGE_INDEX``) on
    every row."""
    counts = pl.Series([r.rows for r in refs], dtype=pl.Int64)
    return frame.with_columns(
        *(_per_row(name, counts, [NO_WINDOW if b is None else b[i] for b in bounds])
          for i, name in enumerate(MARKS)),
        _per_row(MESSAGE_INDEX, counts, list(range(len(refs)))),
    )


def _per_row(name: str, counts: pl.Series, values: list[int]) -> pl.Series:
    """One value per message, repeated for each of its ``counts`` rows."""
    index = pl.int_range(0, counts.len(), eager=True).repeat_by(counts).explode()
    return pl.Series(name, values, dtype=pl.Int64).gather(index)


def _first_end(ts_ms: int, spec: WindowSpec) -> int:
    """The end of the earliest window holding ``ts_ms``."""
    return window_ranges(ts_ms, spec)[0][1]


@dataclass(frozen=True)
class SortedRows:
    """A poll's windowed rows (marked by ``mark_messages``), by where they go."""

    rest: pl.DataFrame        # of windows not emitted: to the open windows
    late: pl.DataFrame        # late, with their window's end (WINDOW_END)
    rebuilding: pl.DataFrame  # a replay's, of kept windows: rebuild them as they were
    revising: pl.DataFrame    # late, of kept windows (or windows open to revisions)
    skipped: int              # a replay's, of emitted windows no longer kept


def sort_rows(windowed: pl.DataFrame, size_ms: int) -> SortedRows:
    """Sort marked, windowed rows by the bounds of their message (``emitted_bounds``)."""
    end = pl.col(WINDOW_START) + size_ms
    emitted_before = end <= pl.col(SKIP_THROUGH)
    emitted_now = ~emitted_before & (end <= pl.col(LATE_THROUGH))
    kept = end > pl.col(KEPT_AFTER)
    unmarked = [*MARKS, MESSAGE_INDEX]
    return SortedRows(
        rest=windowed.filter(~emitted_before & ~emitted_now).drop(unmarked),
        late=windowed.filter(emitted_now & ~kept).drop(MARKS).with_columns(
            end.alias(WINDOW_END)),
        rebuilding=windowed.filter(emitted_before & kept).drop(unmarked),
        revising=windowed.filter(emitted_now & kept).drop(unmarked),
        skipped=windowed.filter(emitted_before & ~kept).height)
