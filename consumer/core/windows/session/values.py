"""The values that aggregates which do not decompose need, per session (``median``,
``quantile``, ``n_unique``, expressions: consumer/core/holistic.py).

A time window keeps its buffered rows under its start; a session has no fixed name: two
sessions that meet become one with a fresh id (spans.py, session_set.py), and that
happens nearly every poll while a session runs. Rewriting the buffered rows' ids at each
merge would cost O(values) a poll, so each buffered row keeps the id of the run it came
in with (its *member* id), and a small table maps member ids to the session holding them
now: a merge rewrites that table, O(runs held). Reading a session's values joins the
two, and takes the chance to rename the rows to their sessions, so the table shrinks
back to one member a session.

Memory is O(rows x buffered columns) of the sessions held (open, and kept for revisions
with ``window.late: revise``), counted for the memory budget like a time window's.
"""

from __future__ import annotations

import polars as pl

from consumer.core.holistic import ValueBuffer
from consumer.core.windows.session.spans import SID

MEMBER = "__session_member"
_OLD = "__session_old_sid"


class SessionValues:
    """Buffered rows of every session of one engine, by session id (``SID``). Every
    session set of the engine (open ones, a replay's) shares it: session ids are unique
    across them."""

    def __init__(self, buffer: ValueBuffer) -> None:
        self._buffer = buffer
        self._rows: list[pl.DataFrame] = []  # MEMBER and the buffered columns
        self._members = pl.DataFrame(schema={MEMBER: pl.Int64, SID: pl.Int64})

    @property
    def buffer(self) -> ValueBuffer:
        return self._buffer

    def add(self, rows: pl.LazyFrame) -> None:
        """Buffer the rows of new runs (with their run's ``SID``)."""
        taken = self._buffer.take(rows).rename({SID: MEMBER})
        if taken.height == 0:
            return
        self._rows.append(taken)
        runs = taken.select(pl.col(MEMBER).unique()).with_columns(pl.col(MEMBER).alias(SID))
        self._members = pl.concat([self._members, runs])

    def relabel(self, old: pl.Series, new: pl.Series) -> None:
        """Sessions merged: the session ``old[i]`` is now part of ``new[i]``."""
        mapping = pl.DataFrame({_OLD: old, SID: new}).unique(_OLD)
        joined = self._members.join(mapping, left_on=SID, right_on=_OLD, how="left",
                                    suffix="_new")
        self._members = joined.select(
            MEMBER, pl.coalesce(pl.col(f"{SID}_new"), pl.col(SID)).alias(SID))

    def of(self, sids: pl.Series) -> list[pl.DataFrame]:
        """The buffered rows of the sessions ``sids`` (``SID`` and the buffered columns),
        as ``ValueBuffer.attach`` takes them; they stay buffered."""
        if not self._rows:
            return []
        return [self._renamed().filter(pl.col(SID).is_in(sids.implode()))]

    def drop(self, sids: pl.Series) -> None:
        """Forget the buffered rows of the sessions ``sids``."""
        if not self._rows:
            return
        kept = self._renamed().filter(~pl.col(SID).is_in(sids.implode()))
        self._store(kept)

    def _renamed(self) -> pl.DataFrame:
        """Every buffered row under its session's id, stored so from now on (one member
        a session): the price of a read is paid once, not again at the next."""
        rows = pl.concat(self._rows, how="vertical_relaxed") if len(self._rows) > 1 \
            else self._rows[0]
        renamed = rows.join(self._members, on=MEMBER, how="inner").select(
            SID, *self._buffer.columns)
        self._store(renamed)
        return renamed

    def _store(self, rows: pl.DataFrame) -> None:
        self._rows = [rows.rename({SID: MEMBER})] if rows.height else []
        self._members = rows.select(pl.col(SID).unique()).with_columns(
            pl.col(SID).alias(MEMBER)).select(MEMBER, SID)

    def count(self) -> int:
        """Values held, for the memory budget (holistic.py's measure)."""
        return self._buffer.count(self._rows)

    def discard(self) -> None:
        self._rows = []
        self._members = self._members.clear()
