"""Stage 1 of the scale-out for session windows: each input partition's rows pre-aggregated
into partial sessions and sent on, by key hash, at every commit interval.

Stage 1 closes nothing: sessions span instances, so only stage 2, which sees every
instance's partial sessions of its keys, can tell when one is whole
(consumer/core/scale_out/session_merge.py). Here a poll is cut into runs and merged into
the partial sessions its partition has not sent yet (``SessionSet``, one per partition,
so that a revoked partition's unsent rows go with it); every ``send_every_ms`` (and, with
early results, every ``window.emit_every_ms``) all of them go out as one closed "window"
of partial states, and every consumed message is then done: a partition's commit offset
is its first message not sent, and nothing needs replaying but what no committed
transaction holds.

**Late rows** are decided here, row by row, from the partition's own order alone: a row
is late when the session it would form on its own ends at or before its partition's
watermark (the largest event time of the partition's earlier messages less
``allowed_lateness_ms``). So a replay decides every row as before: the commit metadata's
``max_event_ms`` is that of the sent messages, the ones before the committed offset. The
frontier reported to stage 2 is the watermark less ``gap_ms``: every row not late, and
every one still to come, starts at or after it, so no partial session stage 1 sends later
can reach a session ending there.

**With ``window.late: revise``** (``revise_within_ms``) a late row no earlier than the
watermark less ``revision_lateness_ms`` is not late after all: it is taken like any other
and goes out in a partial session, which may start before the frontier (stage 2 takes such
a partial as late: it may revise sessions it has emitted). Only rows further behind go to
the late topic from here. The bound is decided here, on the row's time as on one instance
(consumer/core/windows/session/revise.py), because only here is it the same on a replay;
stage 2 can still find a late partial beyond its own bound (an input partition that was
idle, behind the floor) and decides that one itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from consumer.core.aggregate import PartialAggregator
from consumer.core.holistic import ValueBuffer
from consumer.core.offsets import CommitMetadata, CommitPoint, OffsetTracker
from consumer.core.plan import AggregationPlan
from consumer.core.types import (
    MESSAGE_INDEX,
    ROWS,
    WINDOW_END,
    WINDOW_START,
    ClosedWindow,
    MessageRef,
    PartitionKey,
)
from consumer.core.windows.session.session_set import SessionSet
from consumer.core.windows.session.spans import (
    EVENT_MS,
    FIRST,
    LAST,
    SID,
    SessionClock,
    SessionSpec,
    SidAllocator,
    per_message,
    with_runs,
)
from consumer.core.windows.session.values import SessionValues
from consumer.core.windows.watermark import WatermarkTracker

# What a partial session carries besides its keys and exported state: its first and last
# row's time (stage 2 derives its end and boundary interval from them).
PARTIAL_FIRST = "__session_first_ms"
PARTIAL_LAST = "__session_last_ms"

_UNSENT = 2**62  # the "window end" of a consumed message whose rows are not sent yet
_LATE_BEFORE = "__session_late_before"
_NEVER = -(2**62)


class SessionRunsEngine:
    """The stage-1 ``WindowEngine`` for session windows."""

    def __init__(self, plan: AggregationPlan, spec: SessionSpec, *, event_time: bool,
                 time_dtype: pl.DataType | None, allowed_lateness_ms: int,
                 idle_timeout_ms: int, send_every_ms: int,
                 revise_within_ms: int | None = None) -> None:
        """``revise_within_ms``: ``window.revision_lateness_ms`` under ``late: revise``."""
        if event_time and (plan.time_column is None or time_dtype is None):
            raise ValueError("event-time sessions need the plan's time column and its dtype")
        self._spec = spec
        self._keys = list(plan.keys)
        self._clock = SessionClock(plan.time_column if event_time else None, time_dtype)
        self._aggregator = PartialAggregator(plan, (SID,))
        self._sids = SidAllocator()
        # Aggregates that do not decompose: every set of this engine (one a partition,
        # and the merged one a send) buffers the rows' values in it (session ids are
        # unique across them), and a send carries them (``_values_of``).
        buffer = ValueBuffer.for_plan(plan, (SID,))
        self._values = None if buffer is None else SessionValues(buffer)
        self._lateness_ms = allowed_lateness_ms
        self._revise_within_ms = revise_within_ms
        self._send_every_ms = send_every_ms
        self._last_sent_ms: int | None = None
        self._held: dict[PartitionKey, SessionSet] = {}
        self._offsets = OffsetTracker()
        self._watermarks = WatermarkTracker(allowed_lateness_ms=allowed_lateness_ms,
                                            idle_timeout_ms=idle_timeout_ms)
        self._max_ms: dict[PartitionKey, int | None] = {}  # of every consumed message
        self._sent_max_ms: dict[PartitionKey, int | None] = {}  # of the sent ones
        self._position: dict[PartitionKey, int] = {}  # below: late rows written already
        self._unsent: set[PartitionKey] = set()  # partitions with messages not sent yet
        self._seq = 0
        self.late_rows = 0
        self.skipped_replayed_rows = 0

    # -- assignment --------------------------------------------------------------------

    def assign(self, partition: PartitionKey, committed: int | None,
               metadata: CommitMetadata | None, now_ms: int) -> None:
        restored = None if metadata is None else metadata.max_event_ms
        self._offsets.assign(partition, committed,
                             metadata.position if metadata is not None else None)
        self._watermarks.assign(partition, now_ms, restored)
        self._max_ms[partition] = self._sent_max_ms[partition] = restored
        self._position[partition] = -1 if metadata is None else metadata.position
        self._held[partition] = self._new_set()

    def _new_set(self) -> SessionSet:
        return SessionSet(self._aggregator, self._keys, self._spec, self._sids, self._values)

    def revoke(self, partition: PartitionKey) -> None:
        """Its unsent rows go with it: their offsets were never committed."""
        self._offsets.revoke(partition)
        self._watermarks.revoke(partition)
        held = self._held.get(partition)
        if held is not None:
            held.forget(held.pop(pl.lit(value=True)))
        for table in (self._max_ms, self._sent_max_ms, self._position, self._held):
            table.pop(partition, None)
        self._unsent.discard(partition)

    def replaying(self, partition: PartitionKey) -> bool:  # noqa: ARG002
        """Nothing to rebuild: rows not in a committed transaction are simply new."""
        return False

    def ahead_of_watermark(self, now_ms: int) -> list[PartitionKey]:
        return self._watermarks.ahead(now_ms)

    def keep_alive(self, partition: PartitionKey, now_ms: int) -> None:
        self._watermarks.keep_alive(partition, now_ms)

    def skip(self, partition: PartitionKey, offset: int, now_ms: int) -> None:
        self._offsets.record(partition, offset, _UNSENT)
        self._unsent.add(partition)
        self._watermarks.observe(partition, None, now_ms)

    # -- rows in -----------------------------------------------------------------------

    def add(self, frame: pl.DataFrame, refs: Sequence[MessageRef],
            now_ms: int) -> pl.DataFrame | None:
        """Take the poll's rows into their partitions' unsent partial sessions; return
        its late rows (``window_start``/``window_end``: the session each would form)."""
        seq = self._seq
        self._seq += 1
        firsts, late_before, replayed = [], [], []
        for ref in refs:
            first_ms, last_ms = self._clock.times(ref, now_ms)
            firsts.append(first_ms)
            before = self._max_ms.get(ref.partition)
            late_before.append(_NEVER if before is None else before - self._lateness_ms)
            if last_ms is not None and (before is None or last_ms > before):
                self._max_ms[ref.partition] = last_ms
            replayed.append(int(ref.offset < self._position.get(ref.partition, -1)))
            self._offsets.record(ref.partition, ref.offset, _UNSENT)
            self._unsent.add(ref.partition)
            self._watermarks.observe(ref.partition, last_ms, now_ms,
                                     replayed=bool(replayed[-1]))
        rows = self._clock.rows(frame, refs, firsts, [None] * len(refs))
        counts = [r.rows for r in refs]
        own_end = self._spec.end(pl.col(EVENT_MS), self._spec.bucket(pl.col(EVENT_MS)))
        watermark = per_message(_LATE_BEFORE, counts, late_before)
        late = own_end <= watermark
        if self._revise_within_ms is not None:
            late &= pl.col(EVENT_MS) < watermark - self._revise_within_ms
        flagged = rows.with_columns(late.alias(_LATE_BEFORE))
        taken = flagged.filter(~pl.col(_LATE_BEFORE)).drop(_LATE_BEFORE)
        self._take(taken, refs, seq)
        late_rows = flagged.filter(pl.col(_LATE_BEFORE))
        if late_rows.height == 0:
            return None
        replayed_rows = per_message("replayed", counts, replayed).filter(
            flagged.get_column(_LATE_BEFORE))
        fresh = late_rows.filter(replayed_rows == 0)
        self.late_rows += fresh.height
        if fresh.height == 0:
            return None  # written before the restart, with the offsets of that commit
        return fresh.select(
            *frame.columns, MESSAGE_INDEX, pl.col(EVENT_MS).alias(WINDOW_START),
            self._spec.end(pl.col(EVENT_MS), self._spec.bucket(pl.col(EVENT_MS)))
            .alias(WINDOW_END))

    def _take(self, rows: pl.DataFrame, refs: Sequence[MessageRef], seq: int) -> None:
        """Each partition's rows cut into runs and merged into its unsent sessions."""
        if rows.height == 0:
            return
        by_partition: dict[PartitionKey, list[int]] = {}
        for index, ref in enumerate(refs):
            by_partition.setdefault(ref.partition, []).append(index)
        for partition, indexes in by_partition.items():
            held = self._held.get(partition)
            if held is None:
                continue  # revoked while the poll was under way
            mine = rows.filter(pl.col(MESSAGE_INDEX).is_in(indexes))
            if mine.height == 0:
                continue
            runs = held.runs(with_runs(mine, self._keys, self._spec), seq)
            held.add(held.merge_in(runs))

    # -- partial sessions out ----------------------------------------------------------

    def close_due(self, now_ms: int) -> list[ClosedWindow]:
        """Every unsent partial session, once per ``send_every_ms``."""
        if self._last_sent_ms is not None and now_ms - self._last_sent_ms < self._send_every_ms:
            return []
        self._last_sent_ms = now_ms
        return self._send_all()

    def emit_early(self, now_ms: int) -> list[ClosedWindow]:  # noqa: ARG002
        """The memory budget: send what is held now (stage 2 merges it as any partial)."""
        return self._send_all()

    def _send_all(self) -> list[ClosedWindow]:
        # The partitions' sessions merged with each other first: stage 2 takes one
        # record's partial sessions as apart (each partition's are, as maximal chains).
        merged = self._new_set()
        for held in self._held.values():
            sessions = held.pop(pl.lit(value=True))
            if sessions.height:
                merged.add(merged.merge_in(sessions))
        self._offsets.mark_all_done()
        self._unsent.clear()
        self._sent_max_ms = dict(self._max_ms)
        if not len(merged):
            return []
        sessions = merged.pop(pl.lit(value=True))
        frame = self._partial(sessions)
        values = self._values_of(sessions)
        merged.forget(sessions)
        first, last = frame.select(pl.col(PARTIAL_FIRST).min(), pl.col(PARTIAL_LAST).max()).row(0)
        return [ClosedWindow(int(first), int(last) + self._spec.gap_ms, frame,
                             int(frame.get_column(ROWS).sum()), values=values)]

    def _values_of(self, sessions: pl.DataFrame) -> pl.DataFrame | None:
        """The buffered rows of ``sessions`` as stage 2 attaches them: each with its
        partial session's keys and first row's time (``PARTIAL_FIRST``), which name the
        partial among those of a send (a send's sessions of the same keys are apart), and
        the buffered columns (a key among them is the key column itself)."""
        if self._values is None:
            return None
        buffer = self._values.buffer
        rows = self._values.of(sessions.get_column(SID))
        if not rows:
            return None
        own = [c for c in buffer.columns if c not in self._keys]
        named = sessions.select(SID, *self._keys, pl.col(FIRST).alias(PARTIAL_FIRST))
        return buffer.export([rows[0].select(SID, *own).join(named, on=SID)
                              .select(*self._keys, PARTIAL_FIRST, *own)])

    def _partial(self, sessions: pl.DataFrame) -> pl.DataFrame:
        """Sessions as stage 2 takes them: keys, the exported state, first and last."""
        state = self._aggregator.export_state(
            sessions.select(self._aggregator.state_schema.names())).drop(SID)
        return pl.concat([sessions.select(*self._keys), state,
                          sessions.select(pl.col(FIRST).alias(PARTIAL_FIRST),
                                          pl.col(LAST).alias(PARTIAL_LAST))],
                         how="horizontal")

    def provisional(self, now_ms: int) -> list[ClosedWindow]:  # noqa: ARG002
        """Early results (window.emit_every_ms): send every unsent partial session now, as
        at the commit interval, so that stage 2's provisional sessions keep up; stage 2
        shows them (session_merge.py)."""
        return self._send_all()

    def commit_points(self) -> dict[PartitionKey, CommitPoint]:
        points = {}
        for partition in self._offsets.partitions():
            sent = self._sent_max_ms.get(partition)
            point = self._offsets.commit_point(partition, self._frontier(sent), sent)
            if point is not None:
                points[partition] = point
        return points

    def _frontier(self, max_ms: int | None) -> int | None:
        """Every row of the partition not late, sent or to come, starts at or after it
        (but for the late rows ``revise_within_ms`` takes)."""
        return None if max_ms is None else max_ms - self._lateness_ms - self._spec.gap_ms

    def frontiers(self, now_ms: int) -> dict[PartitionKey, tuple[int | None, bool]]:
        """Each partition's frontier, and whether it is idle. An idle partition (one with
        nothing unsent) reports the end of every session it sent instead: when every
        input partition is idle, stage 2's floor is the furthest of them, and every
        session closes, as on one instance."""
        out = {}
        for partition in self._held:
            sent = self._sent_max_ms.get(partition)
            idle = self._watermarks.idle(partition, now_ms) and partition not in self._unsent
            out[partition] = (sent + self._spec.gap_ms if idle and sent is not None
                              else self._frontier(sent), idle)
        return out

    def discard(self) -> None:
        """An abort: the pipeline seeks every partition back to its committed offset."""
        if self._values is not None:
            self._values.discard()
        for partition in self._held:
            self._held[partition] = self._new_set()
        self._max_ms = dict(self._sent_max_ms)

    def cardinality(self) -> int:
        return sum(len(held) for held in self._held.values())

    def merge_pending(self) -> None:
        """Runs merge as they come: nothing is pending."""

    def buffered_values(self) -> int:
        return 0 if self._values is None else self._values.count()

    def open_window_count(self) -> int:
        return self.cardinality()

