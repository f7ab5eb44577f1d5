"""Early results of session windows (``window.emit_every_ms``): which open sessions go
out provisionally, and how their revisions stay numbered across restarts.

Every ``emit_every_ms`` each open session that took in rows since the last time goes out
whole, as it stands (``final: false``, kind ``update``), and stays open: nothing is
taken out, nothing more is kept but two integers. A session's provisional revisions,
its closing one and its late updates share its numbers (``NEXT_REVISION``, which a
merge carries on from the highest of its parts). A subscriber tells which provisional
sessions a later row supersedes by its bounds, as Kafka Streams and Flink merge session
windows by overlap: every provisional session of the row's keys whose ``window_start``
lies in the row's ``[window_start, window_end)`` (docs/wire-format.md). The engine so
needs no memory of what it emitted, and a replay rebuilds each open session over every
provisional start it went out under.

What a restart cannot rebuild is how far numbering had gone: the engine commits the
highest revision any session took (``CommitMetadata.revisions_through``), and once a
replay is over every session rebuilt numbers on past it. Numbers may then skip; none is
used twice. That also numbers the kept sessions (``window.late: revise``) on: their
entries in the commit metadata are dropped, so provisional revisions do not fill it.

Early revisions (the memory budget) need the same, whatever the configuration: they let
the session's rows go, so a restart rebuilds nothing of it, and a row of its keys and
start after the restart opens a session that would number from 0 again; its delta would
then repeat the one before (same keys, start, revision and kind), which subscribers skip.
So once a delta has gone out the engine commits ``revisions_through`` too, and after a
restart every session, rebuilt or new, numbers on past it.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from consumer.core.offsets import SessionRetention
from consumer.core.types import ROWS, ClosedWindow
from consumer.core.windows.frontier import later
from consumer.core.windows.session.closing import key_hashes, rows_of
from consumer.core.windows.session.output import SessionOutput
from consumer.core.windows.session.session_set import SessionSet
from consumer.core.windows.session.spans import (
    EARLY_REVISIONS,
    END,
    FIRST,
    KEPT,
    LAST_SEQ,
    NEXT_REVISION,
    SID,
)


class ProvisionalSessions:
    """Early results of one session engine; ``enabled`` false (no emit_every_ms): none,
    and nothing in the commit metadata."""

    def __init__(self, keys: Sequence[str], *, enabled: bool) -> None:
        self._keys = list(keys)
        self._enabled = enabled
        self._since_seq = 0  # sessions holding rows of this poll or later changed
        self._through: int | None = None  # the highest revision any session took
        self._delta_out = False  # an early revision went out (or did before a restart)

    @property
    def revisions_through(self) -> int | None:
        return self._through if self._enabled or self._delta_out else None

    def emit(self, pool: SessionSet, output: SessionOutput, next_seq: int,
             closed_through: int | None = None) -> list[ClosedWindow]:
        """The provisional revisions of ``pool``'s open sessions that changed since the
        last call (``next_seq``: the number the next poll gets), each taking its
        session's next number. Not those an early revision emptied: their state holds
        part of their rows, and their deltas say the rest; nor those ending at or before
        ``closed_through``, which go out final next (a late partial reopened them)."""
        since, self._since_seq = self._since_seq, next_seq
        sessions = pool.frame()
        if not self._enabled or sessions is None:
            return []
        closing = pl.lit(value=False) if closed_through is None else (
            pl.col(END) <= closed_through)
        due = sessions.filter(~pl.col(KEPT) & (pl.col(ROWS) > 0) & ~closing
                              & (pl.col(EARLY_REVISIONS) == 0) & (pl.col(LAST_SEQ) >= since))
        if due.height == 0:
            return []
        out = output.windows(due, final=False, provisional=True)
        taken = pl.col(SID).is_in(due.get_column(SID).implode())
        pool.rewrite(lambda held: held.with_columns(
            pl.when(taken).then(pl.col(NEXT_REVISION) + 1).otherwise(pl.col(NEXT_REVISION))
            .alias(NEXT_REVISION)))
        return self.saw(out)

    def saw(self, windows: list[ClosedWindow]) -> list[ClosedWindow]:
        """Note the revisions of ``windows`` (going out); return them."""
        for window in windows:
            self._through = later(self._through, window.revision)
            self._delta_out = self._delta_out or window.kind == "delta"
        return windows

    def restore(self, revisions_through: int | None, pool: SessionSet | None = None) -> None:
        """A partition's committed metadata: the highest revision that went out. The
        sessions ``pool`` opens from now on number on past it (one may have the keys and
        start of one that went out early, whose rows the restart does not replay)."""
        self._through = later(self._through, revisions_through)
        self._delta_out = self._delta_out or revisions_through is not None
        through = self.revisions_through
        if pool is not None and through is not None:
            pool.first_revision = max(pool.first_revision, through + 1)

    def rebuilt(self, pool: SessionSet) -> None:
        """A replay is over: ``pool``'s sessions number on past every revision committed,
        and each goes out again at the next turn."""
        self._since_seq = 0
        through = self.revisions_through
        if through is None:
            return
        after = pl.lit(through + 1, pl.Int64)
        pool.rewrite(lambda held: held.with_columns(
            pl.max_horizontal(NEXT_REVISION, after).alias(NEXT_REVISION)))

    def trimmed(self, retention: SessionRetention | None,
                pool: pl.DataFrame | None) -> SessionRetention | None:
        """``retention`` without the kept sessions ``revisions_through`` numbers on
        already; those that open sessions took in stay (their emissions name them)."""
        through = self.revisions_through
        if retention is None or through is None or pool is None or not retention.sessions:
            return retention
        kept = pool.filter(pl.col(KEPT))
        starts = set(zip(key_hashes(rows_of(kept, self._keys)),
                         kept.get_column(FIRST).to_list(), strict=True))
        left = tuple(t for t in retention.sessions
                     if (t[0], t[1]) not in starts or t[2] > through)
        return SessionRetention(retention.kept_after, left)
