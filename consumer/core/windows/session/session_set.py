"""A set of sessions, one row each, and how runs of rows merge into it.

``SessionSet`` holds an engine's open sessions (and, with ``window.late: revise``, the
emitted sessions kept for revisions), or the sessions a replay rebuilds. Runs of a poll
(spans.py) merge into the sessions they touch by a sort-and-scan over interval bounds:
connected intervals become one session, whose partial states merge (associatively) and
whose bounds take the min and max.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import polars as pl

from consumer.core.aggregate import PartialAggregator
from consumer.core.types import ROWS
from consumer.core.windows.session.spans import (
    BUCKET,
    EARLY_REVISIONS,
    END,
    EVENT_MS,
    FIRST,
    FRONTIER,
    KEPT,
    LAST,
    LAST_SEQ,
    META,
    NEXT_REVISION,
    NO_SEQ,
    REPLACES,
    ROW_FRONTIER,
    RUN,
    SCATTERED,
    SEQ,
    SID,
    STATE_FIRST,
    STATE_LAST,
    SessionSpec,
    SidAllocator,
)
from consumer.core.windows.session.values import SessionValues

_GROUP = "__session_group"
_IS_RUN = "__session_is_run"
_REACH = "__session_reach"
_ROW = "__session_row"
_NEW_SID = "__session_new_id"


class SessionSet:
    """Sessions, one row each: ``SID``, the aggregator's state columns (it groups by
    ``SID`` alone: an integer is cheaper to group by than string keys), ``ROWS``, the
    keys and the bookkeeping columns:

    ``FIRST``/``LAST`` the first and last row's time, ``END`` the window end, ``BUCKET``
    the boundary interval, ``SEQ``/``LAST_SEQ`` the first and last poll (numbered by the
    engine) whose rows it holds, ``EARLY_REVISIONS`` how many early revisions went out, and
    ``FRONTIER`` the lowest partition frontier among its rows. A session whose rows all
    went out in an early revision keeps its bounds with no state (``ROWS`` 0), so later
    rows still join it; ``STATE_FIRST``/``STATE_LAST`` bound the rows its state holds,
    and ``SCATTERED`` says they no longer chain on their own (only the emitted rows
    between them did), which a replay could not rebuild.

    With ``window.late: revise``: ``KEPT`` marks an emitted session kept for revisions
    (late rows that reach it merge into it as into an open one, and the merged session
    is open again), ``NEXT_REVISION`` is the revision its next emission gets (a merge
    numbers on from the highest of its parts), and ``REPLACES`` lists the emitted
    sessions (their ``FIRST``) it has taken in, which its next emission replaces.
    """

    def __init__(self, aggregator: PartialAggregator, keys: Sequence[str], spec: SessionSpec,
                 sids: SidAllocator, values: SessionValues | None = None) -> None:
        self._aggregator = aggregator
        self._keys = list(keys)
        self._spec = spec
        self._sids = sids
        self._values = values
        self._open: pl.DataFrame | None = None
        # The revision a new session numbers from: past those committed before a restart
        # (provisional.py).
        self.first_revision = 0

    def __len__(self) -> int:
        return 0 if self._open is None else self._open.height

    def frame(self) -> pl.DataFrame | None:
        return self._open

    def runs(self, rows: pl.DataFrame, seq: int) -> pl.DataFrame:
        """Pre-aggregate ``rows`` (from ``with_runs``, with ``ROW_FRONTIER``) into one
        session row per run, with a fresh ``SID`` and its ``RUN``; their values, if the
        plan buffers any, are buffered under that ``SID``."""
        base = self._sids.take(rows.height and int(rows.get_column(RUN).max()) + 1)  # type: ignore[arg-type]
        with_sid = rows.lazy().with_columns((pl.col(RUN) + base).alias(SID))
        state = self._aggregator.partial(with_sid)
        if not self._aggregator.last_partial_grouped:
            state = self._aggregator.merge([state], regroup=True)
        if self._values is not None:
            self._values.add(with_sid)
        spec = self._spec
        meta = rows.group_by(RUN).agg(
            *(pl.col(k).first() for k in self._keys),
            pl.col(EVENT_MS).min().alias(FIRST), pl.col(EVENT_MS).max().alias(LAST),
            pl.col(BUCKET).first(), pl.col(ROW_FRONTIER).min().alias(FRONTIER),
        ).select(
            (pl.col(RUN) + base).alias(SID), RUN, *self._keys, FIRST, LAST,
            spec.end(pl.col(LAST), pl.col(BUCKET)).alias(END), BUCKET,
            pl.lit(seq, pl.Int64).alias(SEQ), pl.lit(seq, pl.Int64).alias(LAST_SEQ),
            pl.lit(0, pl.Int64).alias(EARLY_REVISIONS), FRONTIER,
            pl.col(FIRST).alias(STATE_FIRST), pl.col(LAST).alias(STATE_LAST),
            pl.lit(value=False).alias(SCATTERED), pl.lit(value=False).alias(KEPT),
            pl.lit(self.first_revision, pl.Int64).alias(NEXT_REVISION),
            pl.lit([], pl.List(pl.Int64)).alias(REPLACES),
        )
        return state.join(meta, on=SID)

    def merge_in(self, runs: pl.DataFrame) -> pl.DataFrame:
        """Merge ``runs`` into the sessions they touch (and, through those, into each
        other); return the runs that touched none, which the caller adds or rejects."""
        if self._open is None or self._open.height == 0 or runs.height == 0:
            return runs
        # Only sessions within reach of the runs' times can touch one: a cheap cut before
        # the join on keys (kept sessions, late: revise, lie mostly behind the runs).
        gap = self._spec.gap_ms
        near = self._open.filter(
            (pl.col(LAST) + gap > runs.get_column(FIRST).min())
            & (pl.col(FIRST) < runs.get_column(LAST).max() + gap))  # type: ignore[operator]
        touched = near if not self._keys else near.join(
            runs.select(self._keys).unique(), on=self._keys, how="semi", nulls_equal=True)
        if touched.height == 0:
            return runs
        pool = pl.concat([touched.with_columns(pl.lit(value=False).alias(_IS_RUN)),
                          runs.with_columns(pl.lit(value=True).alias(_IS_RUN))], how="diagonal")
        grouped = self._grouped(pool)
        size = pl.len().over(_GROUP)
        lone = grouped.filter((size == 1) & pl.col(_IS_RUN))
        merging = grouped.filter(size > 1)
        if merging.height:
            gone = merging.filter(~pl.col(_IS_RUN)).get_column(SID)
            kept = self._open.filter(~pl.col(SID).is_in(gone.implode()))
            self._open = pl.concat([kept, self._merged(merging)])
        return lone.drop(_IS_RUN, _GROUP)

    def _grouped(self, pool: pl.DataFrame) -> pl.DataFrame:
        """``pool`` with ``_GROUP``: the session each interval belongs to once merged
        (the scan of ``with_runs``, over intervals: each starts a group unless it begins
        before the furthest reach of the ones before it)."""
        by = [*self._keys, BUCKET]
        reach = (pl.col(LAST) + self._spec.gap_ms).sort_by(FIRST, maintain_order=True)
        grouped = pool.select(*by, FIRST, LAST).with_row_index(_ROW).select(
            pl.col(_ROW).sort_by(FIRST, maintain_order=True).over(
                by, mapping_strategy="explode"),
            pl.col(FIRST).sort().over(by, mapping_strategy="explode"),
            reach.cum_max().shift(1).over(by, mapping_strategy="explode").alias(_REACH),
        )
        starts = (pl.col(FIRST) >= pl.col(_REACH)).fill_null(value=True)
        labels = grouped.select(_ROW, starts.cum_sum().alias(_GROUP))
        in_order = pl.zeros(pool.height, pl.UInt32, eager=True).alias(_GROUP).scatter(
            labels.get_column(_ROW), labels.get_column(_GROUP))
        return pool.with_columns(in_order)

    def _merged(self, members: pl.DataFrame) -> pl.DataFrame:
        """One session per ``_GROUP`` of ``members``; states merge in the order their
        rows arrived (earliest poll first), which first/last follow. A merged session is
        open: one that takes in a kept session replaces it when it goes out."""
        groups = members.get_column(_GROUP).unique().sort()
        base = self._sids.take(groups.len())
        new_sid = pl.col(_GROUP).rank("dense").cast(pl.Int64) - 1 + base
        renamed = members.with_columns(new_sid.alias(_NEW_SID))
        if not self._aggregator.order_free:  # first/last: the parts in arrival order
            renamed = renamed.sort(SEQ, FIRST)
        if self._values is not None:
            self._values.relabel(renamed.get_column(SID), renamed.get_column(_NEW_SID))
        renamed = renamed.drop(SID).rename({_NEW_SID: SID})
        columns = self._aggregator.state_schema.names()
        with_rows = renamed.filter(pl.col(ROWS) > 0)
        state = self._aggregator.merge([with_rows.select(columns)], regroup=True)
        parts, replaces = _replacing(renamed)
        meta = parts.group_by(SID).agg(
            *(pl.col(k).first() for k in self._keys),
            pl.col(FIRST).min(), pl.col(LAST).max(), pl.col(BUCKET).first(),
            pl.col(SEQ).min(), pl.col(LAST_SEQ).max(), pl.col(EARLY_REVISIONS).max(),
            pl.col(FRONTIER).min(), pl.col(NEXT_REVISION).max(), replaces,
        ).with_columns(self._spec.end(pl.col(LAST), pl.col(BUCKET)).alias(END),
                       pl.lit(value=False).alias(KEPT))
        if (renamed.get_column(EARLY_REVISIONS) > 0).any():
            meta = meta.join(self._held(with_rows), on=SID)
        else:  # no early revision: the states hold every row of their sessions
            meta = meta.with_columns(pl.col(FIRST).alias(STATE_FIRST),
                                     pl.col(LAST).alias(STATE_LAST),
                                     pl.lit(value=False).alias(SCATTERED))
        return state.join(meta, on=SID).select(self._columns())

    def _held(self, parts: pl.DataFrame) -> pl.DataFrame:
        """Per merged ``SID``: the bounds of the rows the states hold, and whether they
        chain without the rows an early revision took away."""
        reach = (pl.col(STATE_LAST) + self._spec.gap_ms).cum_max().shift(1).over(SID)
        apart = (pl.col(STATE_FIRST) >= reach).fill_null(value=False)
        return parts.sort(SID, STATE_FIRST).group_by(SID).agg(
            pl.col(STATE_FIRST).min(), pl.col(STATE_LAST).max(),
            (apart | pl.col(SCATTERED)).any().alias(SCATTERED))

    def _columns(self) -> list[str]:
        return [*self._aggregator.state_schema.names(), *self._keys, *META]

    def add(self, sessions: pl.DataFrame) -> None:
        """Hold ``sessions`` (runs that touched no session, or rebuilt or kept ones)."""
        if sessions.height == 0:
            return
        sessions = sessions.select(self._columns())
        self._open = sessions if self._open is None else pl.concat(
            [self._open, sessions], how="vertical_relaxed")

    def rewrite(self, change: Callable[[pl.DataFrame], pl.DataFrame]) -> None:
        """Rewrite the sessions' bookkeeping in place (``change`` keeps every session
        and column: early results number them, provisional.py)."""
        if self._open is not None:
            self._open = change(self._open)

    def pop(self, due: pl.Expr) -> pl.DataFrame:
        """Remove and return the sessions for which ``due`` holds."""
        if self._open is None:
            return pl.DataFrame()
        popped = self._open.filter(due)
        self._open = self._open.filter(~due)
        return popped

    def empty_out(self) -> pl.DataFrame:
        """Return every open (not kept) session and keep only its bounds (an early
        revision): its state and the sessions it replaces go out (the caller makes them
        output, then ``forget``s their values)."""
        if self._open is None:
            return pl.DataFrame()
        sessions = self._open.filter(~pl.col(KEPT))
        nulls = [pl.lit(None, dtype).alias(name) for name, dtype in sessions.schema.items()
                 if name in self._aggregator.state_schema and name not in (SID, ROWS)]
        emptied = sessions.with_columns(
            *nulls, pl.lit(0, sessions.schema[ROWS]).alias(ROWS),
            pl.lit(NO_SEQ, pl.Int64).alias(SEQ),
            (pl.col(EARLY_REVISIONS) + 1).alias(EARLY_REVISIONS),
            (pl.col(NEXT_REVISION) + 1).alias(NEXT_REVISION),
            pl.lit([], pl.List(pl.Int64)).alias(REPLACES),
            pl.lit(None, pl.Int64).alias(STATE_FIRST), pl.lit(None, pl.Int64).alias(STATE_LAST),
            pl.lit(value=False).alias(SCATTERED))
        self._open = pl.concat([self._open.filter(pl.col(KEPT)), emptied])
        return sessions

    def min_seq(self) -> int | None:
        """The earliest poll whose rows a session holds."""
        if self._open is None or self._open.height == 0:
            return None
        seq = int(self._open.get_column(SEQ).min())  # type: ignore[arg-type]
        return None if seq == NO_SEQ else seq

    def forget(self, sessions: pl.DataFrame) -> None:
        """``sessions`` (popped) are gone for good: drop their buffered values."""
        if self._values is not None and sessions.height:
            self._values.drop(sessions.get_column(SID))

    def discard(self) -> None:
        """Forget every session (their values are the engine's to discard: the sets of
        one engine share them)."""
        self._open = None



def _replacing(members: pl.DataFrame) -> tuple[pl.DataFrame, pl.Expr]:
    """``members`` with a kept session's own start added to its ``REPLACES`` (late:
    revise), and the aggregation giving a merged session every part's, once each, sorted.
    The list work is skipped when no part is kept or replaces anything."""
    if not members.get_column(KEPT).any() and not members.get_column(REPLACES).list.len().max():
        return members, pl.lit([], pl.List(pl.Int64)).alias(REPLACES)
    own = pl.when(pl.col(KEPT)).then(pl.concat_list(REPLACES, FIRST)).otherwise(
        pl.col(REPLACES))
    return (members.with_columns(own.alias(REPLACES)),
            pl.col(REPLACES).list.explode(keep_nulls=False, empty_as_null=False)
            .unique().sort())
