"""Per group keys, how far their sessions are closed: the end of the last one emitted
(or of late rows' would-be session). Every row of those keys before it is closed, every
open session of those keys starts at or after it. A row before it would have to reopen
an emitted session: it is late.

Kept only while it can matter (docs/design.md, "Session windows"): while rows of that
closed session may still be replayed, or while a row could still reach it. While a row
could reach it, its session's rows are kept replayable (``reachable_from``): a restart
knows closed-through only from the rows it replays.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from datetime import date, datetime, time

import polars as pl

from consumer.core.types import NO_WINDOW, ROWS
from consumer.core.windows.session.spans import (
    BUCKET,
    EARLY_REVISIONS,
    END,
    EVENT_MS,
    FIRST,
    LAST_SEQ,
    NO_SEQ,
    SCATTERED,
    SEQ,
    SID,
    STATE_LAST,
    SessionSpec,
)

CT_START = "__closed_start"
CT_END = "__closed_end"
CT_SEQ = "__closed_seq"
CT_FIRST_SEQ = "__closed_first_seq"  # the first poll of the session ending at CT_END


def key_hashes(keys: Iterable[tuple[object, ...]]) -> list[int]:
    """A stable 63-bit hash of each key tuple: it is written to the commit metadata and
    read back by another process, perhaps another version (Polars' hash is neither)."""
    return [int.from_bytes(hashlib.blake2b(_canonical(key), digest_size=8).digest(), "big")
            >> 1 for key in keys]


def _canonical(key: tuple[object, ...]) -> bytes:
    parts = [f"{type(v).__name__}:{v.isoformat() if isinstance(v, (datetime, date, time)) else v!r}"
             for v in key]
    return "\x1f".join(parts).encode()


class ClosedThrough:
    def __init__(self, keys: Sequence[str]) -> None:
        self._keys = list(keys)
        self._frame: pl.DataFrame | None = None

    def __len__(self) -> int:
        return 0 if self._frame is None else self._frame.height

    def record(self, sessions: pl.DataFrame) -> None:
        """Close ``sessions`` (with the keys, ``FIRST``, ``END``, ``SEQ``, ``LAST_SEQ``)."""
        if sessions.height == 0:
            return
        new = sessions.select(*self._keys, pl.col(FIRST).alias(CT_START),
                              pl.col(END).alias(CT_END), pl.col(LAST_SEQ).alias(CT_SEQ),
                              pl.col(SEQ).alias(CT_FIRST_SEQ))
        both = new if self._frame is None else pl.concat([self._frame, new])
        latest = [pl.col(CT_START).last(), pl.col(CT_END).last(), pl.col(CT_SEQ).max(),
                  pl.col(CT_FIRST_SEQ).last()]
        ordered = both.sort(CT_END)
        self._frame = (ordered.group_by(self._keys).agg(latest) if self._keys
                       else ordered.select(latest))

    def split_late(self, rows: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
        """(rows at or after their keys' closed end, rows before it with ``CT_START`` and
        ``CT_END``: the session they would reopen)."""
        if self._frame is None:
            return rows, rows.clear()
        bounds = self._frame.drop(CT_SEQ, CT_FIRST_SEQ)
        if self._keys:
            joined = rows.join(bounds, on=self._keys, how="left", nulls_equal=True,
                               maintain_order="left")
        else:
            joined = rows.with_columns(pl.lit(bounds.item(0, CT_START)).alias(CT_START),
                                       pl.lit(bounds.item(0, CT_END)).alias(CT_END))
        late = (pl.col(EVENT_MS) < pl.col(CT_END)).fill_null(value=False)
        return joined.filter(~late).drop(CT_START, CT_END), joined.filter(late)

    def through(self, rows: pl.DataFrame) -> pl.DataFrame:
        """``rows`` with ``CT_END`` (null where their keys have nothing closed)."""
        if self._frame is None:
            return rows.with_columns(pl.lit(None, pl.Int64).alias(CT_END))
        bounds = self._frame.select(*self._keys, CT_END)
        if not self._keys:
            return rows.with_columns(pl.lit(bounds.item(0, CT_END)).alias(CT_END))
        return rows.join(bounds, on=self._keys, how="left", nulls_equal=True,
                         maintain_order="left")

    def reachable_from(self, through_ms: int | None, gap_ms: int) -> int | None:
        """The first poll of the sessions a row could still reach (closed a gap or less
        before ``through_ms``). A replay must read them again: a row not late by the
        frontier (its own session ends after it) may start up to a gap before it, and
        only a rebuilt session tells a restarted engine that such a row would reopen
        one (docs/design.md, "Session windows")."""
        if self._frame is None or through_ms is None:
            return None
        reachable = self._frame.filter((pl.col(CT_END) > through_ms - gap_ms)
                                       & (pl.col(CT_FIRST_SEQ) != NO_SEQ))
        seq = reachable.get_column(CT_FIRST_SEQ).min()
        return None if seq is None else int(seq)  # type: ignore[arg-type]

    def release(self) -> None:
        """Stop holding the closed sessions' rows replayable: every consumed row went out
        (an early revision), or every partition is idle and the commit should reach the
        end of the input (docs/design.md)."""
        if self._frame is not None:
            self._frame = self._frame.with_columns(pl.lit(NO_SEQ, pl.Int64).alias(CT_FIRST_SEQ))

    def prune(self, before_seq: int | None, through_ms: int | None, gap_ms: int,
              open_sessions: pl.DataFrame | None) -> None:
        """Forget keys whose closed rows can no longer be replayed (last poll before
        ``before_seq``; None: none can), that no row can reach any more (closed a gap
        before ``through_ms``), and that have no open session."""
        if self._frame is None or through_ms is None:
            return
        replayable = pl.col(CT_SEQ) >= before_seq if before_seq is not None else pl.lit(value=False)
        keep = replayable | (pl.col(CT_END) > through_ms - gap_ms)
        kept = self._frame.filter(keep)
        if open_sessions is not None and open_sessions.height and self._keys:
            still_open = self._frame.filter(~keep).join(
                open_sessions.select(self._keys).unique(), on=self._keys, how="semi",
                nulls_equal=True)
            kept = pl.concat([kept, still_open])
        elif open_sessions is not None and open_sessions.height:
            kept = self._frame
        self._frame = kept if kept.height else None

    def discard(self) -> None:
        self._frame = None

    def frame(self) -> pl.DataFrame | None:
        return self._frame

    def keys(self) -> list[str]:
        return self._keys


def rows_of(frame: pl.DataFrame, keys: Sequence[str]) -> list[tuple[object, ...]]:
    """The key tuples of ``frame``, in order."""
    return frame.select(keys).rows() if keys else [() for _ in range(frame.height)]


LISTED_HASH = "__listed_hash"
LISTED_THROUGH = "__listed_through"
LISTED_SEQ = "__listed_seq"


class ListedKeys:
    """Keys whose replayed rows the frontier alone cannot classify, each with the time
    that splits them (closed before it, open at or after it) and the last poll that made
    them so: they go into the commit metadata while that poll may be replayed."""

    def __init__(self, keys: Sequence[str]) -> None:
        self._keys = list(keys)
        self._frame: pl.DataFrame | None = None

    def add(self, keyed: pl.DataFrame, seq: int) -> None:
        """List the keys of ``keyed`` (with ``CT_END``: their splitting time)."""
        if keyed.height == 0:
            return
        latest = pl.col(CT_END).max().alias(LISTED_THROUGH)
        distinct = (keyed.group_by(self._keys).agg(latest) if self._keys
                    else keyed.select(latest))
        hashes = key_hashes(rows_of(distinct, self._keys))
        new = distinct.select(*self._keys, pl.Series(LISTED_HASH, hashes, dtype=pl.Int64),
                              LISTED_THROUGH, pl.lit(seq, pl.Int64).alias(LISTED_SEQ))
        both = new if self._frame is None else pl.concat([self._frame, new])
        merged = [pl.col(LISTED_HASH).first(), pl.col(LISTED_THROUGH).max(),
                  pl.col(LISTED_SEQ).max()]
        self._frame = both.group_by(self._keys).agg(merged) if self._keys \
            else both.select(merged)

    def prune(self, before_seq: int | None) -> None:
        """Forget the keys no replay can reach (their poll is before ``before_seq``)."""
        if self._frame is not None:
            kept = self._frame.filter(pl.col(LISTED_SEQ) >= before_seq) \
                if before_seq is not None else self._frame.clear()
            self._frame = kept if kept.height else None

    def frame(self) -> pl.DataFrame | None:
        return self._frame

    def discard(self) -> None:
        self._frame = None


def emptied_at_risk(sessions: pl.DataFrame | None, keys: Sequence[str], spec: SessionSpec,
                    frontier_ms: int) -> pl.DataFrame | None:
    """The keys of sessions an early revision emptied whose rows since then a replay
    could not rebuild as one session ending after ``frontier_ms`` (docs/design.md)."""
    if sessions is None:
        return None
    state_end = spec.end(pl.col(STATE_LAST), pl.col(BUCKET))
    at_risk = (pl.col(EARLY_REVISIONS) > 0) & (pl.col(ROWS) > 0) & (
        pl.col(SCATTERED) | (state_end <= frontier_ms))
    return sessions.filter(at_risk).select(*keys, SID)


def listing(keys: Sequence[str], late: pl.DataFrame | None, emptied: pl.DataFrame | None,
            closed: ClosedThrough, restored: dict[int, int], *,
            at_most: int | None) -> tuple[tuple[int, int], ...] | None:
    """(key hash, splitting time) for the commit metadata: keys listed for a late row
    (``late``, a ListedKeys frame), keys of ``emptied`` sessions at risk, and keys a
    replay still uses (``restored``); None when more than ``at_most``."""
    emptied_keys = None
    if emptied is not None and emptied.height:
        emptied_keys = emptied.select(keys).unique() if keys else emptied.head(1).select(SID)
    count = (0 if late is None else late.height) + len(restored) + (
        0 if emptied_keys is None else emptied_keys.height)
    if at_most is not None and count > at_most:
        return None
    parts = [] if late is None else [late.select(*keys, LISTED_HASH, LISTED_THROUGH)]
    if emptied_keys is not None:
        parts.append(emptied_keys.select(
            *keys, pl.Series(LISTED_HASH, key_hashes(rows_of(emptied_keys, keys)),
                             dtype=pl.Int64),
            pl.lit(NO_WINDOW, pl.Int64).alias(LISTED_THROUGH)))
    listed = dict(restored)
    if parts:
        keyed = closed.through(pl.concat(parts))
        through = pl.max_horizontal(LISTED_THROUGH, pl.col(CT_END).fill_null(NO_WINDOW))
        for key_hash, at in keyed.select(LISTED_HASH, through).rows():
            listed[key_hash] = max(at, listed.get(key_hash, at))
    return tuple(sorted(listed.items()))
