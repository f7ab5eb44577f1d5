"""Session windows per group keys: a session closes once the watermark passes its last
row plus the gap; rows that bridge sessions merge them, across polls and partitions.

Time is event time (the plan's time column) or, for ``time: processing``, each
message's Kafka timestamp: a replay must give every row the time it had before, and
the daemon's clock cannot (docs/design.md, "Session windows", has the whole design:
lateness, commit offsets, what the frontier means, and why a replay is exact). Which
rows are late, and what is kept to tell, is in consumer/core/windows/session/late.py;
with ``window.late: revise``, which emitted sessions are kept and which late rows revise
them, in revise.py.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

import polars as pl

from consumer.core.aggregate import PartialAggregator
from consumer.core.holistic import ValueBuffer
from consumer.core.offsets import CommitMetadata, CommitPoint, OffsetTracker
from consumer.core.plan import AggregationPlan
from consumer.core.types import (
    MESSAGE_INDEX,
    NO_WINDOW,
    ROWS,
    ClosedWindow,
    MessageRef,
    PartitionKey,
)
from consumer.core.windows.frontier import PartitionFrontier, later, read_before_restart
from consumer.core.windows.session.late import LatePolicy, LateRows
from consumer.core.windows.session.offsets import PollOffsets
from consumer.core.windows.session.output import SessionOutput
from consumer.core.windows.session.provisional import ProvisionalSessions
from consumer.core.windows.session.replay import SessionReplay, named_by_origin
from consumer.core.windows.session.revise import RevisingRows
from consumer.core.windows.session.session_set import SessionSet
from consumer.core.windows.session.spans import (
    END,
    EVENT_MS,
    FRONTIER,
    KEPT,
    ROW_FRONTIER,
    SID,
    SessionClock,
    SessionSpec,
    SidAllocator,
    per_message,
)
from consumer.core.windows.session.values import SessionValues
from consumer.core.windows.watermark import WatermarkTracker

log = logging.getLogger(__name__)

# Keys a replay could not classify by the frontier alone are written to every commit's
# metadata while their rows may be replayed; past this many the open sessions go out as
# early revisions instead, so that nothing is left to replay (the metadata of an offset
# commit is limited: offset.metadata.max.bytes, 4096 bytes by default).
MAX_LISTED_KEYS = 48
# An open session its rows' partitions have closed through already (late: revise).
_DUE_NOW = pl.col(END) <= pl.col(FRONTIER)


class SessionWindowEngine:
    def __init__(self, plan: AggregationPlan, spec: SessionSpec, *, event_time: bool,
                 time_dtype: pl.DataType | None, allowed_lateness_ms: int,
                 idle_timeout_ms: int, revise_within_ms: int | None = None,
                 provisional: bool = False) -> None:
        """``revise_within_ms``: keep emitted sessions this long past their end (against
        the watermark) and revise them with late rows (None: late rows are late).
        ``provisional``: early results (``provisional``; provisional.py)."""
        if event_time and (plan.time_column is None or time_dtype is None):
            raise ValueError("event-time sessions need the plan's time column and its dtype")
        self._spec = spec
        self._keys = list(plan.keys)
        self._clock = SessionClock(plan.time_column if event_time else None, time_dtype)
        self._aggregator = PartialAggregator(plan, (SID,))
        self._sids = SidAllocator()
        buffer = ValueBuffer.for_plan(plan, (SID,))
        self._values = None if buffer is None else SessionValues(buffer)
        self._open = SessionSet(self._aggregator, self._keys, spec, self._sids, self._values)
        self._output = SessionOutput(self._aggregator, self._keys, self._values,
                                     revising=revise_within_ms is not None)
        self._late: LatePolicy = LateRows(self._open, self._keys, spec) \
            if revise_within_ms is None else RevisingRows(self._open, self._keys, spec,
                                                           revise_within_ms)
        self._early = ProvisionalSessions(self._keys, enabled=provisional)
        self._offsets = OffsetTracker()
        self._watermarks = WatermarkTracker(
            allowed_lateness_ms=allowed_lateness_ms, idle_timeout_ms=idle_timeout_ms)
        self._progress: dict[PartitionKey, PartitionFrontier] = {}
        self._closed_through: int | None = None  # the furthest this instance closed
        self._seq = 0  # polls, numbered: sessions remember the first and last they hold
        self._polls = PollOffsets()
        self._replay: SessionReplay | None = None
        # Late rows not handed out yet: (rows, their poll, their first message per partition)
        self._unreported: list[tuple[pl.DataFrame, int, dict[PartitionKey, int]]] = []
        self._held_messages = 0
        self.late_rows = 0
        self.skipped_replayed_rows = 0

    # -- assignment --------------------------------------------------------------------

    def assign(self, partition: PartitionKey, committed: int | None,
               metadata: CommitMetadata | None, now_ms: int) -> None:
        self._offsets.assign(partition, committed,
                             metadata.position if metadata is not None else None)
        if metadata is None or metadata.frontier is None:
            progress = PartitionFrontier(self._closed_through)
        else:
            progress = PartitionFrontier(metadata.frontier)
            self._closed_through = later(self._closed_through, metadata.frontier)
        self._progress[partition] = progress
        self._watermarks.assign(partition, now_ms, None)
        if metadata is None:
            return
        progress.restored_max_ms = metadata.max_event_ms
        self._late.restore(metadata.kept_sessions)
        self._early.restore(metadata.revisions_through, self._open)
        # Rows from `waiting` on were consumed but never taken into a session: new again.
        until = metadata.position if metadata.waiting is None else min(
            metadata.position, metadata.waiting)
        self._polls.restore(partition, metadata.waiting, metadata.position)
        if committed is not None and until > committed:
            progress.replay_until = until
            self._start_replay().restore(metadata.closed)
        elif self._replay is None:
            self._restore_max(now_ms)

    def revoke(self, partition: PartitionKey) -> None:
        self._offsets.revoke(partition)
        self._watermarks.revoke(partition)
        self._progress.pop(partition, None)
        self._polls.forget(partition)

    def replaying(self, partition: PartitionKey) -> bool:
        """True until the partition has been re-read up to where the last run had got."""
        progress = self._progress.get(partition)
        if progress is None or progress.replay_until < 0 or self._replay is None:
            return False
        next_offset = self._offsets.next_offset(partition)
        return next_offset is None or next_offset < progress.replay_until

    def ahead_of_watermark(self, now_ms: int) -> list[PartitionKey]:
        return self._watermarks.ahead(now_ms)

    def keep_alive(self, partition: PartitionKey, now_ms: int) -> None:
        self._watermarks.keep_alive(partition, now_ms)

    def skip(self, partition: PartitionKey, offset: int, now_ms: int) -> None:
        """A message with no usable rows: done at once, and proof the partition is alive."""
        self._offsets.record(partition, offset, NO_WINDOW)
        self._watermarks.observe(partition, None, now_ms)

    def _start_replay(self) -> SessionReplay:
        if self._replay is None:
            sessions = SessionSet(self._aggregator, self._keys, self._spec, self._sids,
                                  self._values)
            self._replay = SessionReplay(sessions, self._keys, self._spec)
        return self._replay

    def _restore_max(self, now_ms: int) -> None:
        """Restored event progress counts once the replay is over (as in time.py)."""
        for partition, progress in self._progress.items():
            if progress.restored_max_ms is not None:
                self._watermarks.observe(partition, progress.restored_max_ms, now_ms,
                                         replayed=True)
                progress.restored_max_ms = None

    # -- rows in -----------------------------------------------------------------------

    def add(self, frame: pl.DataFrame, refs: Sequence[MessageRef],
            now_ms: int) -> pl.DataFrame | None:
        """Cut the poll into runs and merge them into the open sessions; return its late
        rows (``window_start``/``window_end``: the session they missed), and any late
        rows of earlier polls held during a replay (named by ``ORIGIN_*``)."""
        seq = self._seq
        self._seq += 1
        times = [self._clock.times(ref, now_ms) for ref in refs]
        for ref, (_, last_ms) in zip(refs, times, strict=True):
            self._offsets.record(ref.partition, ref.offset, NO_WINDOW)
            self._polls.record(seq, ref.partition, ref.offset)
            self._watermarks.observe(ref.partition, last_ms, now_ms,
                                     replayed=self._replayed(ref))
        frontiers = [self._frontier(r.partition) for r in refs]
        rows = self._clock.rows(frame, refs, [t for t, _ in times], frontiers)
        if self._replay is not None:
            replayed = per_message("replayed", [r.rows for r in refs],
                                   [int(self._replayed(r)) for r in refs]).cast(pl.Boolean)
            self._replay.take(rows, replayed, refs, seq, self._frontier_max())
            self._late.take_matched(self._replay.matched)
            if not self._replay_over(now_ms):
                return None
            self._end_replay(now_ms)
            return self._report()
        late = self._live(rows, frame.columns, seq)
        if late is not None:
            self._unreported.append((late, seq, {}))
        return self._report()

    def _frontier(self, partition: PartitionKey) -> int | None:
        progress = self._progress.get(partition)
        return self._closed_through if progress is None else progress.frontier

    def _frontier_max(self) -> int | None:
        frontiers = [p.frontier for p in self._progress.values() if p.frontier is not None]
        if self._closed_through is not None:
            frontiers.append(self._closed_through)
        return max(frontiers, default=None)

    def _replayed(self, ref: MessageRef) -> bool:
        return read_before_restart(self._progress.get(ref.partition), ref.offset)

    def _live(self, rows: pl.DataFrame, columns: list[str], seq: int) -> pl.DataFrame | None:
        """Late rows out, the rest merged into the open sessions (session_late.py)."""
        out = self._late.take(rows, columns, seq, self._frontier_max())
        if out is not None:
            self.late_rows += out.height
        return out

    def _report(self) -> pl.DataFrame | None:
        """Late rows not yet handed out; rows of earlier polls name their message."""
        if not self._unreported:
            return None
        frames = [frame for frame, _, _ in self._unreported]
        self._unreported.clear()
        return pl.concat(frames, how="diagonal")

    # -- the end of a replay -----------------------------------------------------------

    def _replay_over(self, now_ms: int) -> bool:
        return not any(self.replaying(p) and not self._watermarks.idle(p, now_ms)
                       for p in self._progress)

    def _end_replay(self, now_ms: int) -> None:
        """Decide the rebuilt sessions, then take the rows that waited, in order."""
        replay, self._replay = self._replay, None
        assert replay is not None  # noqa: S101 - called while replaying
        emitted, still_open = replay.resolve()
        skipped = replay.skipped_rows + _rows_in(emitted)
        self.skipped_replayed_rows += skipped
        log.info("session replay over: %d replayed rows were in emitted sessions (skipped), "
                 "%d open sessions rebuilt, %d polls of new rows waited", skipped,
                 still_open.height, len(replay.held))
        still_open = self._late.resolve(emitted, still_open)
        self._open.add(self._open.merge_in(still_open))
        self._early.rebuilt(self._open)  # numbering goes on past what went out before
        for held in replay.held:
            ours = (EVENT_MS, MESSAGE_INDEX, ROW_FRONTIER)
            columns = [c for c in held.rows.columns if c not in ours]
            late = self._live(held.rows, columns, held.seq)
            if late is not None:
                named = named_by_origin(late, held.refs, self._held_messages)
                self._held_messages += len(held.refs)
                self._unreported.append((named, held.seq, held.waiting))
        for progress in self._progress.values():
            progress.replay_until = -1
        self._restore_max(now_ms)

    # -- sessions out ------------------------------------------------------------------

    def provisional(self, now_ms: int) -> list[ClosedWindow]:  # noqa: ARG002
        """Early results: open sessions that grew, whole (provisional.py); not while a
        replay runs (the open sessions are not known yet)."""
        if self._replay is not None:
            return []
        return self._early.emit(self._open, self._output, self._seq)

    def close_due(self, now_ms: int) -> list[ClosedWindow]:
        if self._replay is not None:
            if not self._replay_over(now_ms):
                return []
            self._end_replay(now_ms)
        watermark = self._watermarks.current(now_ms)
        if watermark.all_idle:
            due = self._open.pop(~pl.col(KEPT))
            through = int(due.get_column(END).max()) if due.height else None  # type: ignore[arg-type]
        else:
            # Sessions of late rows taken (late: revise) are due at once: their partitions'
            # frontiers are past them already.
            through = watermark.value_ms
            passed = _DUE_NOW if through is None else _DUE_NOW | (pl.col(END) <= through)
            due = self._open.pop(~pl.col(KEPT) & passed)
        closed = self._output.windows(due, final=True)
        self._late.closed(due)
        if through is not None:
            self._advance(through)
            if not watermark.all_idle:  # event time stands still: kept sessions stay
                self._late.expire(through)
        self._prune(let_go=watermark.all_idle)
        return self._early.saw(closed + self._overflow(now_ms))

    def _advance(self, through_ms: int) -> None:
        self._closed_through = later(self._closed_through, through_ms)
        for progress in self._progress.values():
            progress.frontier = later(progress.frontier, through_ms)

    def _overflow(self, now_ms: int) -> list[ClosedWindow]:
        kept = self._early.trimmed(self._late.retention(), self._open.frame())
        named = 0 if kept is None else len(kept.sessions)
        if self._listed_now(at_most=MAX_LISTED_KEYS - named) is not None:
            return []
        return self.emit_early(now_ms)

    def emit_early(self, now_ms: int) -> list[ClosedWindow]:  # noqa: ARG002
        """Emit every open session as a non-final revision and keep only its bounds, so
        the groups held stay within the budget; all consumed input is then emitted."""
        if self._replay is not None:
            return []  # the rebuilt sessions are not known yet: the replay comes first
        self._late.forget_kept(self._closed_through)
        emptied = self._open.empty_out()
        early = self._output.windows(emptied, final=False)
        self._open.forget(emptied)
        self._prune(let_go=True)
        return self._early.saw(early)

    def _min_seq(self) -> int | None:
        replay = None if self._replay is None else self._replay.min_seq()
        seqs = [self._open.min_seq(), self._late.replay_from(self._closed_through), replay,
                *(seq for _, seq, _ in self._unreported)]
        return min((s for s in seqs if s is not None), default=None)

    def _prune(self, *, let_go: bool = False) -> None:
        """Forget polls, listed keys and closed keys nothing can replay or reach.
        ``let_go``: every consumed row went out (an early revision), or all partitions
        are idle: no closed session holds its rows for a replay (docs/design.md)."""
        if let_go:
            self._late.release()
        min_seq = self._min_seq()
        self._polls.prune(min_seq)
        self._late.prune(min_seq, self._closed_through)

    def _listed_now(self, *, at_most: int | None = None) -> tuple[tuple[int, int], ...] | None:
        """The keys to list in the commit metadata, with the time splitting their rows
        (None: more than ``at_most``)."""
        restored = {} if self._replay is None else self._replay.listed
        return self._late.listing(self._min_seq(), self._closed_through, restored,
                                  at_most=at_most)

    def commit_points(self) -> dict[PartitionKey, CommitPoint] | None:
        """None while a session the frontier has passed is not out yet (a late row's,
        until the next close_due): a replay would take it for an emitted one."""
        opened = self._open.frame()
        if opened is not None and opened.filter(~pl.col(KEPT) & _DUE_NOW).height:
            return None
        listed = self._listed_now() or ()  # bounded by close_due's overflow check
        kept = self._early.trimmed(self._late.retention(), self._open.frame())
        held = self._polls.held(self._min_seq())
        untaken = [waiting for _, _, waiting in self._unreported]
        if self._replay is not None:
            untaken.append(self._replay.waiting())
        waiting = self._polls.waiting(untaken, self._offsets.next_offset)
        points = {}
        for partition in self._offsets.partitions():
            progress = self._progress.get(partition) or PartitionFrontier(self._closed_through)
            seen = later(self._watermarks.max_event_ms(partition), progress.restored_max_ms)
            point = self._offsets.commit_point(partition, progress.frontier, seen)
            if point is None:
                continue
            offset = min(point.offset, held.get(partition, point.offset))
            points[partition] = CommitPoint(offset, replace(
                point.metadata, closed=listed, waiting=waiting.get(partition),
                kept_sessions=kept, revisions_through=self._early.revisions_through))
        return points

    def frontiers(self, now_ms: int) -> dict[PartitionKey, tuple[int | None, bool]]:
        """Each assigned partition's frontier, and whether it is idle."""
        return {partition: (progress.frontier, self._watermarks.idle(partition, now_ms))
                for partition, progress in self._progress.items()}

    def discard(self) -> None:
        self._open.discard()
        if self._values is not None:
            self._values.discard()
        self._replay = None
        self._unreported.clear()
        self._polls.prune(None)

    def merge_pending(self) -> None:
        """Sessions hold one state each: nothing is pending."""

    def cardinality(self) -> int:
        return len(self._open) + (0 if self._replay is None else self._replay.cardinality())

    def buffered_values(self) -> int:
        return 0 if self._values is None else self._values.count()

    def open_window_count(self) -> int:
        """Open sessions, and what waits: rebuilt sessions and held polls of a replay,
        late rows not handed out yet (a replay that ended on idleness leaves them for
        the next poll, and holds their offsets until then)."""
        replay = 0 if self._replay is None else len(self._replay.sessions) + len(self._replay.held)
        return len(self._open) + replay + len(self._unreported)


def _rows_in(sessions: pl.DataFrame) -> int:
    return int(sessions.get_column(ROWS).sum()) if sessions.height else 0
