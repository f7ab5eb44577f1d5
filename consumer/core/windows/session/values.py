"""The values that aggregates which do not decompose need, per session (``median``,
``quantile``, ``n_unique``, expressions: consumer/core/holistic.py).

A time window keeps its buffered rows under its start; a session has no fixed name: two
sessions that meet become one with a fresh id (spans.py, session_set.py), and that
happens nearly every poll while a session runs. Rewriting the buffered rows' ids at each
merge would cost O(values) a poll, so each buffered row keeps the id of the run it came
in with (its *member* id), and a small table maps member ids to the session holding them
now: a merge rewrites that table, O(runs held). Reading or dropping sessions' values
filters the rows by their members' ids; once the table holds many members a session,
the rows are renamed to their sessions' ids and it is one member a session again.

Memory is O(rows x buffered columns) of the sessions held (open, and kept for revisions
with ``window.late: revise``), counted for the memory budget like a time window's.
"""

from __future__ import annotations

import polars as pl

from consumer.core.holistic import ValueBuffer
from consumer.core.windows.session.spans import SID

MEMBER = "__session_member"
_OLD = "__session_old_sid"
# Past this many member ids a session on average, the rows are renamed (an O(values) join).
_MEMBERS_A_SESSION = 8


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

    def add_to(self, rows: pl.DataFrame) -> None:
        """Buffer ``rows`` (``SID`` and the buffered columns) into sessions already held
        (stage 2 of the scale-out: a partial session's values come after it, and it may
        have merged meanwhile). The session id is the rows' member id; it joins the
        member table unless it is in it already (then it names that same session)."""
        if rows.height == 0:
            return
        taken = rows.select(pl.col(SID).alias(MEMBER), *self._buffer.columns)
        self._rows.append(taken)
        fresh = taken.select(pl.col(MEMBER).unique()).join(self._members, on=MEMBER,
                                                            how="anti")
        self._members = pl.concat([self._members, fresh.with_columns(pl.col(MEMBER).alias(SID))])

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
        members = self._members.filter(pl.col(SID).is_in(sids.implode()))
        mine = self._all().filter(pl.col(MEMBER).is_in(members.get_column(MEMBER).implode()))
        return [mine.join(members, on=MEMBER).select(SID, *self._buffer.columns)]

    def drop(self, sids: pl.Series) -> None:
        """Forget the buffered rows of the sessions ``sids``."""
        if not self._rows:
            return
        gone = pl.col(SID).is_in(sids.implode())
        members = self._members.filter(gone).get_column(MEMBER)
        self._rows = [self._all().filter(~pl.col(MEMBER).is_in(members.implode()))]
        self._members = self._members.filter(~gone)
        if self._members.height > _MEMBERS_A_SESSION * self._members.get_column(SID).n_unique():
            self._rename()

    def _all(self) -> pl.DataFrame:
        """Every buffered row, in one frame from now on (a read filters them all)."""
        if len(self._rows) > 1:
            self._rows = [pl.concat(self._rows, how="vertical_relaxed")]
        return self._rows[0]

    def _rename(self) -> None:
        """Give every buffered row its session's id, so the member table is one row a
        session again: it grows by a row per run a session takes in."""
        renamed = self._all().join(self._members, on=MEMBER).select(
            pl.col(SID).alias(MEMBER), *self._buffer.columns)
        self._rows = [renamed]
        self._members = self._members.select(pl.col(SID).unique()).with_columns(
            pl.col(SID).alias(MEMBER)).select(MEMBER, SID)

    def count(self) -> int:
        """Values held, for the memory budget (holistic.py's measure)."""
        return self._buffer.count(self._rows)

    def discard(self) -> None:
        self._rows = []
        self._members = self._members.clear()
