"""Late rows of session windows under ``window.late: revise``: emitted sessions are kept,
and a late row within ``revision_lateness_ms`` extends one, or bridges two, as Flink and
Kafka Streams do (docs/design.md, "Late-data revisions of sessions", has the rules and
why a replay rebuilds exactly what was emitted).

Kept sessions live among the open ones (``KEPT``): a row that reaches one merges into it
and the merged session is open again, replacing the emitted ones it took in when it goes
out (``REPLACES``): at once when the watermark is past it, else when it closes. Per keys:

- a row at or after the first row of an open session of its keys is always taken: it can
  reach nothing forgotten;
- any other row is taken when it is no earlier than *kept-after* (the watermark less
  ``revision_lateness_ms``: emitted sessions ending at or before it are forgotten) and no
  earlier than its keys' *forgotten-through* (the end of their sessions forgotten early);
- every other row is late. Kept sessions of its keys that start before it are forgotten
  (their end becomes forgotten-through): so every kept or open row of those keys comes
  after every late row, which lets a replay drop the late ones by time alone. Keys whose
  late rows a replay could chain with a session are *listed* in the commit metadata.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from consumer.core.offsets import SessionRetention
from consumer.core.types import MESSAGE_INDEX, NO_WINDOW, WINDOW_END, WINDOW_START
from consumer.core.windows.frontier import later
from consumer.core.windows.session.closing import (
    CT_END,
    LISTED_SEQ,
    ListedKeys,
    emptied_at_risk,
    key_hashes,
    rows_of,
)
from consumer.core.windows.session.session_set import SessionSet
from consumer.core.windows.session.spans import (
    BUCKET,
    EARLY_REVISIONS,
    END,
    EVENT_MS,
    FIRST,
    KEPT,
    LAST,
    NEXT_REVISION,
    REPLACES,
    RUN,
    SID,
    SessionSpec,
    with_runs,
)

FORGOTTEN = "__session_forgotten_through"
OPEN_FIRST = "__session_open_first"
_LATEST = "__session_latest_late"
_FIRSTS = "__session_firsts"
_FORGOT = "__session_forgot"


class RevisingRows:
    """Kept-after, forgotten-through and the listed keys of one session engine, and its
    rows taken against them: late rows out, the others merged into ``pool``."""

    def __init__(self, pool: SessionSet, keys: list[str], spec: SessionSpec,
                 revise_within_ms: int) -> None:
        self._pool = pool
        self._keys = keys
        self._spec = spec
        self._within = revise_within_ms
        self._kept_after: int | None = None
        self._forgotten: pl.DataFrame | None = None  # keys, FORGOTTEN
        self._listed = ListedKeys(keys)
        # From the commit metadata, for a replay: kept-after and (key hash, start) ->
        # last revision of the emitted sessions kept or taken in.
        self._restored_after: int | None = None
        self._restored: dict[tuple[int, int], int] = {}
        # Restored too: sessions starting before it may continue one an early revision
        # emptied before the restart, whose rows the new state lacks; they are not kept.
        self._emptied_through: int | None = None

    # -- rows in -----------------------------------------------------------------------

    def take(self, rows: pl.DataFrame, columns: list[str], seq: int,
             frontier: int | None) -> pl.DataFrame | None:  # noqa: ARG002 - LateRows' shape
        """Late rows out; the others merged into the pool (open, or kept and reopened)."""
        taken, late, forgot = self._judge(rows)
        if taken.height:
            runs = self._pool.runs(with_runs(taken, self._keys, self._spec), seq)
            self._pool.add(self._pool.merge_in(runs))
        if late.height == 0:
            return None
        self._list(late, forgot, seq)
        return _late_frame(late, self._keys, self._spec, columns)

    def take_sessions(self, sessions: pl.DataFrame, seq: int) -> pl.DataFrame:
        """Sessions (``SessionSet`` rows: stage 2 of the scale-out's partial sessions, each
        apart from the others) judged as rows at their first row's time, which is what
        a replay splits them by; the others merged into the pool. Returns the late ones.
        A late session's keys are listed by its last row's time: its reach."""
        taken, late, forgot = self._judge(sessions.with_columns(pl.col(FIRST).alias(EVENT_MS)))
        if taken.height:
            self._pool.add(self._pool.merge_in(taken.drop(EVENT_MS)))
        if late.height == 0:
            return late.drop(EVENT_MS)
        self._list(late.with_columns(pl.col(LAST).alias(EVENT_MS)), forgot, seq)
        return late.drop(EVENT_MS)

    def _judge(self, rows: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
        """(rows taken, late rows, keys whose kept sessions their late rows forgot, with
        ``_FORGOT``)."""
        open_first = self._open_first()
        forgot = [rows.select(*self._keys, pl.lit(1, pl.Int64).alias(_FORGOT)).clear()]
        # Forgetting kept sessions moves forgotten-through, which can make more rows late,
        # which can forget more kept sessions: a few rounds at most (one per kept session).
        while True:
            marked = self._joined(self._joined(rows, open_first, OPEN_FIRST),
                                  self._forgotten, FORGOTTEN)
            t = pl.col(EVENT_MS)
            recent = t >= (NO_WINDOW if self._kept_after is None else self._kept_after)
            taken = (t >= pl.col(OPEN_FIRST)).fill_null(value=False) | (
                recent & (t >= pl.col(FORGOTTEN)).fill_null(value=True))
            late = marked.filter(~taken)
            victims = self._kept_before(late)
            if victims.height == 0:
                return (marked.filter(taken).drop(OPEN_FIRST, FORGOTTEN),
                        late.drop(OPEN_FIRST, FORGOTTEN), pl.concat(forgot).unique())
            self._pool.pop(pl.col(SID).is_in(victims.get_column(SID).implode()))
            self._pool.forget(victims)
            self._forget(victims.select(*self._keys, END))
            forgot.append(victims.select(*self._keys, pl.lit(1, pl.Int64).alias(_FORGOT)))

    def _kept_before(self, late: pl.DataFrame) -> pl.DataFrame:
        """The kept sessions of ``late``'s keys that start at or before its latest row
        there: left kept, one could be taken into an open session that reaches back over
        the late row, and a replay could no longer drop late rows by time."""
        pool = self._pool.frame()
        if late.height == 0 or pool is None:
            return pl.DataFrame()
        latest = self._per_keys(late, pl.col(EVENT_MS).max().alias(_LATEST))
        kept = self._joined(pool.filter(pl.col(KEPT)), latest, _LATEST)
        return kept.filter(pl.col(FIRST) <= pl.col(_LATEST)).drop(_LATEST)

    def _open_first(self) -> pl.DataFrame | None:
        """Per keys, the first row of their earliest open session."""
        pool = self._pool.frame()
        if pool is None:
            return None
        opened = pool.filter(~pl.col(KEPT))
        if opened.height == 0:
            return None
        return self._per_keys(opened, pl.col(FIRST).min().alias(OPEN_FIRST))

    def _per_keys(self, frame: pl.DataFrame, agg: pl.Expr) -> pl.DataFrame:
        return frame.group_by(self._keys).agg(agg) if self._keys else frame.select(agg)

    def _joined(self, rows: pl.DataFrame, table: pl.DataFrame | None,
                column: str) -> pl.DataFrame:
        """``rows`` with ``table``'s ``column`` (one value per keys) joined on, null
        where their keys have none."""
        if table is None or table.height == 0:
            return rows.with_columns(pl.lit(None, pl.Int64).alias(column))
        if self._keys:
            return rows.join(table.select(*self._keys, column), on=self._keys, how="left",
                             nulls_equal=True, maintain_order="left")
        return rows.with_columns(pl.lit(table.item(0, column), pl.Int64).alias(column))

    def _forget(self, ends: pl.DataFrame) -> None:
        """Rows before ``END`` (per keys) can no longer be revised in: forgotten-through."""
        ended = ends.rename({END: FORGOTTEN})
        both = ended if self._forgotten is None else pl.concat([self._forgotten, ended])
        self._forgotten = self._per_keys(both, pl.col(FORGOTTEN).max())

    def _list(self, late: pl.DataFrame, forgot: pl.DataFrame, seq: int) -> None:
        """List the keys whose late rows a replay could chain with a session, or take
        for an emitted one: they went with a forgotten kept session, they lie within a
        gap of kept-after, or of a session of their keys."""
        latest = self._per_keys(late, pl.col(EVENT_MS).max().alias(CT_END))
        reach = pl.col(CT_END) + self._spec.gap_ms
        near = reach > (NO_WINDOW if self._kept_after is None else self._kept_after)
        pool = self._pool.frame()
        firsts = None if pool is None or pool.height == 0 else self._per_keys(
            pool, pl.col(FIRST).min().alias(_FIRSTS))
        marked = self._joined(self._joined(latest, firsts, _FIRSTS), forgot, _FORGOT)
        near = near | (pl.col(_FIRSTS) < reach).fill_null(value=False) | pl.col(
            _FORGOT).is_not_null()
        self._listed.add(marked.filter(near).select(*self._keys, CT_END), seq)

    def take_matched(self, matched: list[tuple[pl.DataFrame, int]]) -> None:
        """Listed keys met in a replay (keys and ``CT_END``, per poll; emptied here) stay
        listed; their rows before the listed time were dropped, so sessions there are
        forgotten."""
        for table, seq in matched:
            self._listed.add(table, seq)
            self._forget(table.select(*self._keys, pl.col(CT_END).alias(END)))
        matched.clear()

    # -- sessions out ------------------------------------------------------------------

    def closed(self, sessions: pl.DataFrame) -> None:
        """``sessions`` went out, final: kept for revisions, but those an early revision
        emptied (their state holds part of their rows): forgotten, and kept-after moves
        past them, so no late row can reach them."""
        if sessions.height == 0:
            return
        whole = (pl.col(EARLY_REVISIONS) == 0) & self._whole_since_restart() & (
            pl.col(END) > (NO_WINDOW if self._kept_after is None else self._kept_after))
        self._pool.add(sessions.filter(whole).with_columns(
            pl.lit(value=True).alias(KEPT), (pl.col(NEXT_REVISION) + 1).alias(NEXT_REVISION),
            pl.lit([], pl.List(pl.Int64)).alias(REPLACES)))
        partial = sessions.filter(~whole)
        self._pool.forget(partial)
        if partial.height:
            self._kept_after = later(self._kept_after, int(partial.get_column(END).max()))  # type: ignore[arg-type]

    def _whole_since_restart(self) -> pl.Expr:
        if self._emptied_through is None:
            return pl.lit(value=True)
        return pl.col(FIRST) >= self._emptied_through

    def expire(self, watermark_ms: int) -> None:
        """Kept sessions ending ``revise_within_ms`` or more before the watermark are
        forgotten."""
        self._kept_after = later(self._kept_after, watermark_ms - self._within)
        self._drop_kept()

    def forget_kept(self, through_ms: int | None) -> None:
        """Forget every kept session (the memory budget emits early): kept-after moves
        to ``through_ms``, the end of the last one."""
        self._kept_after = later(self._kept_after, through_ms)
        self._drop_kept()

    def _drop_kept(self) -> None:
        if self._kept_after is None:
            return
        expired = self._pool.pop(pl.col(KEPT) & (pl.col(END) <= self._kept_after))
        self._pool.forget(expired)
        if self._forgotten is not None:
            ahead = self._forgotten.filter(pl.col(FORGOTTEN) > self._kept_after)
            self._forgotten = ahead if ahead.height else None

    # -- restarts ----------------------------------------------------------------------

    def restore(self, retention: SessionRetention | None) -> None:
        """A partition's committed retention: kept-after, and the sessions it names."""
        if retention is None:
            return
        self._restored_after = later(self._restored_after, retention.kept_after)
        self._kept_after = later(self._kept_after, retention.kept_after)
        self._emptied_through = later(self._emptied_through, retention.emptied_through)
        for key_hash, start, revision in retention.sessions:
            at = (key_hash, start)
            self._restored[at] = max(revision, self._restored.get(at, revision))

    def resolve(self, emitted: pl.DataFrame, still_open: pl.DataFrame) -> pl.DataFrame:
        """The end of a replay: rebuilt sessions emitted before and ending after the
        restored kept-after are kept again (numbered on from the metadata), the other
        emitted ones are forgotten; rebuilt open sessions learn the emitted sessions they
        took in. Returns the open ones."""
        after = NO_WINDOW if self._restored_after is None else self._restored_after
        keep = (pl.col(END) > after) & self._whole_since_restart()
        kept = emitted.filter(keep) if emitted.height else emitted
        forgotten = emitted.filter(~keep) if emitted.height else emitted
        self._pool.forget(forgotten)
        if forgotten.height:  # no late row may start them again (as closed() does)
            self._kept_after = later(self._kept_after, int(forgotten.get_column(END).max()))  # type: ignore[arg-type]
        if kept.height:
            last = [self._restored.get(at, 0) for at in self._starts(kept)]
            self._pool.add(kept.with_columns(
                pl.lit(value=True).alias(KEPT),
                (pl.Series(last, dtype=pl.Int64) + 1).alias(NEXT_REVISION)))
        if still_open.height and self._restored:
            still_open = self._taken_in(still_open)
        self._restored.clear()
        return still_open

    def _starts(self, sessions: pl.DataFrame) -> list[tuple[int, int]]:
        hashes = key_hashes(rows_of(sessions, self._keys))
        return list(zip(hashes, sessions.get_column(FIRST).to_list(), strict=True))

    def _taken_in(self, sessions: pl.DataFrame) -> pl.DataFrame:
        """``sessions`` (open) with the restored sessions of their keys within their
        bounds as ``REPLACES``, numbered on from them."""
        hashes = key_hashes(rows_of(sessions, self._keys))
        firsts, ends = sessions.get_column(FIRST).to_list(), sessions.get_column(END).to_list()
        replaces, numbers = [], []
        for key_hash, first, end in zip(hashes, firsts, ends, strict=True):
            inside = {s: r for (h, s), r in self._restored.items()
                      if h == key_hash and first <= s < end}
            replaces.append(sorted(inside))
            numbers.append(max(inside.values()) + 1 if inside else 0)
        return sessions.with_columns(pl.Series(REPLACES, replaces, dtype=pl.List(pl.Int64)),
                                     pl.Series(NEXT_REVISION, numbers, dtype=pl.Int64))

    # -- the commit metadata -----------------------------------------------------------

    def retention(self) -> SessionRetention:
        """Kept-after, and the emitted sessions a replay must be told of (while a replay
        runs, those it was told of: the sessions it rebuilds are not decided yet)."""
        named = dict(self._restored)
        pool = self._pool.frame()
        if pool is not None and pool.height:
            revised = pool.filter(pl.col(KEPT) & (pl.col(NEXT_REVISION) > 1))
            taken_in = pool.filter(~pl.col(KEPT) & (pl.col(REPLACES).list.len() > 0)).explode(
                REPLACES).with_columns(pl.col(REPLACES).alias(FIRST))
            both = pl.concat([revised.select(*self._keys, FIRST, NEXT_REVISION),
                              taken_in.select(*self._keys, FIRST, NEXT_REVISION)])
            for at, following in zip(self._starts(both),
                                     both.get_column(NEXT_REVISION).to_list(), strict=True):
                named[at] = max(following - 1, named.get(at, 0))
        triples = sorted((h, s, r) for (h, s), r in named.items())
        return SessionRetention(self._kept_after, tuple(triples), self._emptied_now())

    def _emptied_now(self) -> int | None:
        """The latest end of an open session an early revision emptied, or the restored
        one if later."""
        pool = self._pool.frame()
        emptied = None if pool is None else pool.filter(pl.col(EARLY_REVISIONS) > 0)
        if emptied is None or emptied.height == 0:
            return self._emptied_through
        return later(self._emptied_through, int(emptied.get_column(END).max()))  # type: ignore[arg-type]

    def listing(self, min_seq: int | None, closed_through: int | None,
                restored: dict[int, int], *,
                at_most: int | None) -> tuple[tuple[int, int], ...] | None:
        """The keys to list (None: more than ``at_most``), each with the time a replay
        splits their rows at: before it everything was emitted, late or forgotten, at or
        after it every row is in an open session (the first row of their first open
        session; without one, the frontier: all their rows are closed)."""
        late = self._listed.frame()
        if late is not None:
            late = late.filter(pl.col(LISTED_SEQ) >= min_seq) if min_seq is not None \
                else late.clear()
        parts = [] if late is None else [late.select(self._keys)]
        if closed_through is not None and (emptied := emptied_at_risk(
                self._pool.frame(), self._keys, self._spec, closed_through)) is not None:
            parts.append(emptied.select(self._keys))
        named = pl.concat(parts).unique() if parts else None
        count = len(restored) + (0 if named is None else named.height)
        if at_most is not None and count > at_most:
            return None
        listed = dict(restored)
        if named is not None and named.height:
            split = self._joined(named, self._open_first(), OPEN_FIRST).with_columns(
                pl.col(OPEN_FIRST).fill_null(NO_WINDOW if closed_through is None
                                             else closed_through))
            hashes = key_hashes(rows_of(split, self._keys))
            for key_hash, at in zip(hashes, split.get_column(OPEN_FIRST).to_list(), strict=True):
                # A replay running still splits by the restored time: the sessions it
                # rebuilds are not among the open ones yet.
                listed.setdefault(key_hash, at)
        return tuple(sorted(listed.items()))

    def replay_from(self, closed_through: int | None) -> None:
        """The kept sessions hold their own rows replayable (they are open sessions)."""

    def release(self) -> None:
        """Nothing but open sessions (kept ones among them) holds a poll replayable."""

    def prune(self, min_seq: int | None, closed_through: int | None) -> None:  # noqa: ARG002
        """Forget listed keys no replay can reach."""
        self._listed.prune(min_seq)

    def discard(self) -> None:
        """The engine's state is gone (an abort, a revoke): what a replay rebuilds."""
        self._listed.discard()
        self._forgotten = None


def _late_frame(late: pl.DataFrame, keys: Sequence[str], spec: SessionSpec,
                columns: list[str]) -> pl.DataFrame:
    """Late rows with the bounds of the session they would form on their own."""
    runs = with_runs(late, keys, spec)
    bounds = runs.group_by(RUN).agg(pl.col(EVENT_MS).min().alias(FIRST),
                                    pl.col(EVENT_MS).max().alias(LAST), pl.col(BUCKET).first())
    bounds = bounds.with_columns(spec.end(pl.col(LAST), pl.col(BUCKET)).alias(END))
    marked = runs.join(bounds.select(RUN, FIRST, END), on=RUN, maintain_order="left")
    return marked.select(*columns, MESSAGE_INDEX, pl.col(FIRST).alias(WINDOW_START),
                         pl.col(END).alias(WINDOW_END))

