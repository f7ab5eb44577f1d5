"""Late rows of session windows, and what the session engine keeps to find them.

Per keys the engine keeps *closed-through* (consumer/core/windows/session/closing.py): a row
before it would reopen an emitted session and is late (rule 1); a row whose session,
merged with the open sessions it touches, would end at or before the frontier is late
too (rule 2), and that end becomes its keys' closed-through. Every other row is merged
into the open sessions. Keys whose late rows a replay could not tell from rows of an
open session are *listed* in the commit metadata while those rows may be replayed.
docs/design.md ("Session windows") has the rules and why a replay is exact with them.
"""

from __future__ import annotations

from typing import Protocol

import polars as pl

from consumer.core.offsets import SessionRetention
from consumer.core.types import MESSAGE_INDEX, WINDOW_END, WINDOW_START
from consumer.core.windows.session.closing import (
    CT_END,
    CT_START,
    LISTED_SEQ,
    ClosedThrough,
    ListedKeys,
    emptied_at_risk,
    listing,
)
from consumer.core.windows.session.session_set import SessionSet
from consumer.core.windows.session.spans import (
    END,
    EVENT_MS,
    FIRST,
    FRONTIER,
    LAST_SEQ,
    RUN,
    SEQ,
    SessionSpec,
    with_runs,
)


class LatePolicy(Protocol):
    """What the session engine asks of its late-row rules: ``LateRows`` (late rows go to
    the late topic, or are dropped) or ``RevisingRows`` (window.late: revise, revise.py)."""

    def take(self, rows: pl.DataFrame, columns: list[str], seq: int,
             frontier: int | None) -> pl.DataFrame | None: ...
    def take_matched(self, matched: list[tuple[pl.DataFrame, int]]) -> None: ...
    def closed(self, sessions: pl.DataFrame) -> None:
        """``sessions`` (taken out of the open ones) went out, final."""

    def expire(self, watermark_ms: int) -> None: ...
    def forget_kept(self, through_ms: int | None) -> None: ...
    def restore(self, retention: SessionRetention | None) -> None: ...
    def resolve(self, emitted: pl.DataFrame, still_open: pl.DataFrame) -> pl.DataFrame:
        """The end of a replay: take the rebuilt sessions found emitted; return the open
        ones."""

    def retention(self) -> SessionRetention | None: ...
    def listing(self, min_seq: int | None, closed_through: int | None,
                restored: dict[int, int], *,
                at_most: int | None) -> tuple[tuple[int, int], ...] | None: ...
    def prune(self, min_seq: int | None, closed_through: int | None) -> None: ...
    def replay_from(self, closed_through: int | None) -> int | None:
        """The first poll a replay must read again for the rows kept here."""

    def release(self) -> None:
        """Let every consumed row go: nothing kept here holds a poll replayable."""

    def discard(self) -> None: ...


class LateRows:
    """Closed-through and the listed keys of one session engine, and its rows taken
    against them: late rows out, the others into ``open_sessions``."""

    def __init__(self, open_sessions: SessionSet, keys: list[str], spec: SessionSpec) -> None:
        self._open = open_sessions
        self._keys = keys
        self._spec = spec
        self._closed = ClosedThrough(keys)
        self._listed = ListedKeys(keys)

    def closed(self, sessions: pl.DataFrame) -> None:
        """``sessions`` went out: closed, and their values no longer needed."""
        self._closed.record(sessions)
        self._open.forget(sessions)

    def resolve(self, emitted: pl.DataFrame, still_open: pl.DataFrame) -> pl.DataFrame:
        """The rebuilt sessions a replay found emitted are closed."""
        self.closed(emitted)
        return still_open

    def expire(self, watermark_ms: int) -> None:
        """Nothing is kept for revisions."""

    def forget_kept(self, through_ms: int | None) -> None:
        """Nothing is kept for revisions."""

    def restore(self, retention: SessionRetention | None) -> None:
        """Nothing was kept for revisions."""

    def retention(self) -> None:
        return None

    def discard(self) -> None:
        """Closed-through outlives the open sessions: a replay does not rebuild it."""

    def take(self, rows: pl.DataFrame, columns: list[str], seq: int,
             frontier: int | None) -> pl.DataFrame | None:
        """Late rows out (rule 1: before their keys' closed end; rule 2: their session
        would close at once), the rest merged into the open sessions. ``frontier``: the
        furthest frontier of the engine's partitions."""
        late = []
        if len(self._closed) and frontier is not None and bool(
                (rows.get_column(EVENT_MS) < frontier).any()):
            rows, reopening = self._closed.split_late(rows)
            if reopening.height:
                self._list_last_gap(reopening, seq)
                late.append(_late_frame(reopening, columns, CT_START, CT_END))
        if rows.height:
            runs_rows = with_runs(rows, self._keys, self._spec)
            lone = self._open.merge_in(self._open.runs(runs_rows, seq))
            closed_at_once = pl.col(END) <= pl.col(FRONTIER)
            self._open.add(lone.filter(~closed_at_once))
            gone = lone.filter(closed_at_once)
            if gone.height:
                self._closed.record(gone)
                self._open.forget(gone)
                runs_late = runs_rows.join(gone.select(RUN, FIRST, END), on=RUN)
                late.append(_late_frame(runs_late, columns, FIRST, END))
        if not late:
            return None
        return pl.concat(late)

    def _list_last_gap(self, reopening: pl.DataFrame, seq: int) -> None:
        """Keys whose late rows lie within a gap of the end they would reopen: a replay
        could not tell them from rows of an open session (docs/design.md)."""
        near = reopening.filter(pl.col(EVENT_MS) + self._spec.gap_ms > pl.col(CT_END))
        self._listed.add(near.select(*self._keys, CT_END), seq)

    def take_matched(self, matched: list[tuple[pl.DataFrame, int]]) -> None:
        """Listed keys met in the replay (emptied here) stay listed, and closed through
        their time."""
        for table, seq in matched:
            self._listed.add(table, seq)
            self._closed.record(table.select(
                *self._keys, pl.col(CT_END).alias(FIRST), pl.col(CT_END).alias(END),
                pl.lit(seq, pl.Int64).alias(SEQ), pl.lit(seq, pl.Int64).alias(LAST_SEQ)))
        matched.clear()

    def listing(self, min_seq: int | None, closed_through: int | None,
                restored: dict[int, int], *,
                at_most: int | None) -> tuple[tuple[int, int], ...] | None:
        """The keys to list in the commit metadata, with the time splitting their rows
        (None: more than ``at_most``). ``min_seq``: the oldest poll a replay could
        re-read; ``restored``: the listed keys a running replay still uses."""
        late = self._listed.frame()
        if late is not None:
            late = late.filter(pl.col(LISTED_SEQ) >= min_seq) if min_seq is not None \
                else late.clear()
        emptied = None if closed_through is None else emptied_at_risk(
            self._open.frame(), self._keys, self._spec, closed_through)
        return listing(self._keys, late, emptied, self._closed, restored, at_most=at_most)

    def replay_from(self, closed_through: int | None) -> int | None:
        """The first poll of the closed sessions a row could still reach."""
        return self._closed.reachable_from(closed_through, self._spec.gap_ms)

    def release(self) -> None:
        self._closed.release()

    def prune(self, min_seq: int | None, closed_through: int | None) -> None:
        """Forget listed keys and closed keys nothing can replay or reach."""
        self._listed.prune(min_seq)
        self._closed.prune(min_seq, closed_through, self._spec.gap_ms, self._open.frame())


def _late_frame(rows: pl.DataFrame, columns: list[str], start: str, end: str) -> pl.DataFrame:
    return rows.select(*columns, MESSAGE_INDEX, pl.col(start).alias(WINDOW_START),
                       pl.col(end).alias(WINDOW_END))
