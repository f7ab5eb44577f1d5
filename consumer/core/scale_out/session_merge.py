"""Stage 2 of the scale-out for session windows, for one repartition partition: every
instance's partial sessions of the keys that hash here merged into sessions, each emitted
once every input partition's frontier is past its end.

Partial sessions (consumer/core/scale_out/session_runs.py) merge as runs merge on one
instance (``SessionSet``): those of the same keys whose windows touch or overlap become
one, whichever instance and input partition each came from. The floor is the scale-out's
(consumer/core/scale_out/merge.py, ``Reports``): the lowest frontier among the input
partitions that are not idle. Stage 1 reports as frontier a time every partial it sends
later starts at or after, so a session ending at or before the floor can no longer grow:
it goes out, and the floor becomes this part's *emitted-through*, said to subscribers by
a frontier marker ("every session of this part ending at or before T is out").

A partial session starting before emitted-through could reach a session already out (an
input partition that was idle brings rows again): it is late, finalized for the late
topic as aggregates, never merged (but under ``late: revise``, below).

**Offsets and replay.** A session remembers the first record (offset) that fed it; the
committed repartition offset is the oldest open session's first record. A restart replays
from there up to the recorded position, merging every partial with no lateness test, then
forgets the rebuilt sessions ending at or before the committed emitted-through (they went
out: an emitted session touched no open one, and no partial read after it reached it) and
keeps the others open, whole (their first records are replayed).

**Revisions** (``window.late: revise``) follow one instance's rules (revise.py), a partial
session judged as a row at its first row's time. Stage 1 takes a late row within
``revision_lateness_ms`` of its partition's watermark into a partial session, which may
start before emitted-through: an emitted session is *kept* (``KEPT``, with its state and
values) until the floor less ``revision_lateness_ms`` (*kept-after*) passes its end, a
partial reaching it merges into it, and the merged session goes out as an ``update``
naming the sessions it ``replaces``, in the next frontier batch (at the next flush:
until then the part neither commits nor sends, or a replay would take the reopened session
for an emitted one). A partial from a partition that is not idle always starts at or
after kept-after (stage 1's frontier is of rows sent, so behind a late row it took); one
that does not (an idle partition come back) is late, and its keys are *listed* in the
commit metadata when a replay could chain it with a kept or open session: the replay drops
their partials before the listed time. Kept sessions hold the committed offset at their
first records: a replay rebuilds them, and the metadata numbers them on.

**Early results** (``window.emit_every_ms``) work as on one instance
(consumer/core/windows/session/provisional.py): the open sessions that took in a partial
since the last time go out whole, provisional; a session's provisional revisions and its
closing one share its numbers, and the commit metadata's ``revisions_through`` numbers the
sessions a replay rebuilds on past every revision that went out. They change what is
emitted, not what is kept or committed: the sessions are held anyway until they close.
"""

from __future__ import annotations

import polars as pl

from consumer.core.aggregate import PartialAggregator
from consumer.core.holistic import ValueBuffer
from consumer.core.offsets import CommitMetadata, CommitPoint
from consumer.core.scale_out.merge import Reports, plan_from_text
from consumer.core.scale_out.session_runs import PARTIAL_FIRST, PARTIAL_LAST
from consumer.core.types import ClosedWindow, PartitionKey
from consumer.core.windows.session.closing import CT_END, key_hashes, rows_of
from consumer.core.windows.session.output import SessionOutput
from consumer.core.windows.session.provisional import ProvisionalSessions
from consumer.core.windows.session.revise import RevisingRows
from consumer.core.windows.session.session_set import SessionSet
from consumer.core.windows.session.spans import (
    BUCKET,
    EARLY_REVISIONS,
    END,
    FIRST,
    FRONTIER,
    KEPT,
    LAST,
    LAST_SEQ,
    NEXT_REVISION,
    REPLACES,
    SCATTERED,
    SEQ,
    SID,
    STATE_FIRST,
    STATE_LAST,
    SessionSpec,
    SidAllocator,
)
from consumer.core.windows.session.values import SessionValues
from wire.repartition import KIND_VALUES, Partial, ProgressRecord

_ROW = "__values_row"
_PRIORITY = "__values_priority"


class SessionMergeEngine:
    def __init__(self, partition: PartitionKey, inputs: set[PartitionKey], spec: SessionSpec,
                 *, committed: int | None, metadata: CommitMetadata | None,
                 provisional: bool = False, revise_within_ms: int | None = None) -> None:
        """``provisional``: early results (window.emit_every_ms); ``revise_within_ms``:
        keep emitted sessions this long past their end (against the floor) and revise
        them with the partials that reach them (window.late: revise)."""
        self.partition = partition
        self._spec = spec
        self._provisional = provisional
        self._revise_within_ms = revise_within_ms
        self._revising: RevisingRows | None = None
        # From the commit metadata, for a replay (late: revise): the kept sessions, and
        # the keys whose replayed partials before their time are dropped.
        self._restored_kept = None if metadata is None else metadata.kept_sessions
        self._listed: dict[int, int] = {} if metadata is None else dict(metadata.closed)
        self._matched: list[tuple[pl.DataFrame, int]] = []
        self._reports = Reports(set(inputs))
        self._plan_text: str | None = None
        self._aggregator: PartialAggregator | None = None
        self._sessions: SessionSet | None = None
        self._output: SessionOutput | None = None
        self._values: SessionValues | None = None
        # Late partial sessions, held until the writer's progress record: their values
        # come in records after them (holistic aggregates), and they go out with them.
        self._late_held: SessionSet | None = None
        self._sids = SidAllocator()
        self._emitted_through = None if metadata is None else metadata.frontier
        self._next = committed
        self._reached = max(committed or 0, 0 if metadata is None else metadata.position)
        # Records below it were read before the restart: merged with no lateness test.
        self._replay_until = -1 if metadata is None else metadata.position
        self._late: list[ClosedWindow] = []
        # No keys yet: they name kept sessions (late: revise), once the plan is known.
        self._early = ProvisionalSessions((), enabled=provisional)
        self._early.restore(None if metadata is None else metadata.revisions_through)

    # -- records in ----------------------------------------------------------------------

    def add_partial(self, offset: int, partial: Partial) -> None:
        self._moved(offset)
        sessions, aggregator = self._sessions_for(partial.plan)
        state = _uniform(pl.DataFrame(partial.state))
        if partial.kind == KIND_VALUES:
            self._add_values(state)
            return
        rows = self._as_sessions(state, aggregator, offset)
        if self._replaying(offset):
            if self._listed:
                rows = self._without_listed(rows, offset)
        elif self._revising is not None:
            self._hold_late(self._revising.take_sessions(rows, offset))
            return
        elif self._emitted_through is not None:
            self._hold_late(rows.filter(pl.col(FIRST) < self._emitted_through))
            rows = rows.filter(pl.col(FIRST) >= self._emitted_through)
        # One record's sessions are apart (stage 1 merged them): each merges on its own.
        sessions.add(sessions.merge_in(rows))

    def _hold_late(self, late: pl.DataFrame) -> None:
        """Late partial sessions: out with the writer's progress record (values come
        between), or at once when the plan buffers none."""
        if late.height == 0:
            return
        assert self._late_held is not None  # noqa: S101 - built with the set
        self._late_held.add(late)
        if self._values is None:
            self._release_late()

    def _without_listed(self, rows: pl.DataFrame, offset: int) -> pl.DataFrame:
        """Replayed partial sessions without those of listed keys starting before their
        listed time (late, emitted or forgotten before the restart: late: revise); the
        keys met are noted for the end of the replay."""
        keys = list(self.keys())
        hashes = key_hashes(rows_of(rows, keys))
        split = pl.Series(CT_END, [self._listed.get(h) for h in hashes], dtype=pl.Int64)
        marked = rows.with_columns(split)
        met = marked.filter(pl.col(CT_END).is_not_null())
        if met.height == 0:
            return rows
        self._matched.append((met.select(*keys, CT_END).unique(), offset))
        return marked.filter(~(pl.col(FIRST) < pl.col(CT_END)).fill_null(value=False)).drop(
            CT_END)

    def _add_values(self, rows: pl.DataFrame) -> None:
        """A ``values`` record: buffered rows of partial sessions read before it (the
        same send's), each named by its partial's keys and first row's time. A row goes
        to the late partial held with exactly that start, else to the open session of
        those keys holding that time (the partial merged into it; sessions of the same
        keys are apart, so one holds it). A row no session holds is of one that went out
        before a restart (a replay reads values whose partial it did not): dropped."""
        if self._values is None or self._sessions is None or self._late_held is None:
            raise ValueError("values on the repartition topic for a plan that buffers none")
        keys, spec = list(self.keys()), self._spec
        first = pl.col(PARTIAL_FIRST)
        numbered = rows.with_row_index(_ROW).with_columns(spec.bucket(first).alias(BUCKET))
        candidates = []
        for priority, held in enumerate((self._late_held, self._sessions)):
            frame = held.frame()
            if frame is not None and frame.height:
                candidates.append(frame.select(SID, *keys, FIRST, LAST, BUCKET).with_columns(
                    pl.lit(priority).alias(_PRIORITY)))
        if not candidates:
            return
        late_exact = (pl.col(_PRIORITY) == 0) & (pl.col(FIRST) == first)
        holding = (pl.col(_PRIORITY) == 1) & (pl.col(FIRST) <= first) & (first <= pl.col(LAST))
        matched = numbered.join(pl.concat(candidates), on=[*keys, BUCKET], how="inner",
                                nulls_equal=True).filter(late_exact | holding)
        matched = matched.sort(_ROW, _PRIORITY).unique(_ROW, keep="first")
        self._values.add_to(matched.select(SID, *self._values.buffer.columns))

    def _release_late(self) -> None:
        """The late partial sessions held, finalized for the late topic (with their
        values: the progress record after them comes after those too)."""
        if self._late_held is None or self._output is None or not len(self._late_held):
            return
        late = self._late_held.pop(pl.lit(value=True))
        self._late += self._output.windows(late, final=True)
        self._late_held.forget(late)

    def add_progress(self, offset: int, progress: ProgressRecord) -> None:
        self._moved(offset)
        self._release_late()
        self._reports.update(progress)

    def skip(self, offset: int) -> None:
        self._moved(offset)

    def _moved(self, offset: int) -> None:
        if not self._replaying(offset):
            self._end_replay()
        self._next = max(offset + 1, self._next or 0)
        self._reached = max(self._reached, offset + 1)

    def _replaying(self, offset: int) -> bool:
        return offset < self._replay_until

    def _end_replay(self) -> None:
        """The replay is over: rebuilt sessions ending at or before emitted-through went
        out before the restart; the others are open."""
        if self._replay_until < 0:
            return
        self._replay_until = -1
        if self._sessions is None:
            return
        emitted = pl.lit(value=False) if self._emitted_through is None else (
            pl.col(END) <= self._emitted_through)
        if self._revising is None:
            self._sessions.forget(self._sessions.pop(emitted))
        else:  # the emitted ones are kept again, or forgotten (revise.py decides)
            rebuilt = self._sessions.pop(pl.lit(value=True))
            self._revising.take_matched(self._matched)
            self._sessions.add(self._revising.resolve(rebuilt.filter(emitted),
                                                      rebuilt.filter(~emitted)))
        self._early.rebuilt(self._sessions)  # numbering goes on past what went out before

    def _sessions_for(self, plan_text: str) -> tuple[SessionSet, PartialAggregator]:
        if self._sessions is None or self._aggregator is None or plan_text != self._plan_text:
            if self._sessions is not None:  # kept ones are let go: their partials are late
                self._sessions.forget(self._sessions.pop(pl.col(KEPT)))
                if len(self._sessions):
                    raise ValueError("the aggregation plan changed while sessions were open")
            plan = plan_from_text(plan_text)
            self._plan_text = plan_text
            self._aggregator = PartialAggregator(plan, (SID,))
            keys = list(plan.keys)
            buffer = ValueBuffer.for_plan(plan, (SID,))
            self._values = None if buffer is None else SessionValues(buffer)
            self._sessions = SessionSet(self._aggregator, keys, self._spec, self._sids,
                                        self._values)
            self._late_held = SessionSet(self._aggregator, keys, self._spec, self._sids,
                                         self._values)
            self._output = SessionOutput(self._aggregator, keys, self._values,
                                         revising=self._revise_within_ms is not None)
            if self._revise_within_ms is not None:
                self._revising = RevisingRows(self._sessions, keys, self._spec,
                                              self._revise_within_ms)
                self._revising.restore(self._restored_kept)
                early = ProvisionalSessions(keys, enabled=self._provisional)
                early.restore(self._early.revisions_through)
                self._early = early
        return self._sessions, self._aggregator

    def _as_sessions(self, state: pl.DataFrame, aggregator: PartialAggregator,
                     offset: int) -> pl.DataFrame:
        """Partial sessions as ``SessionSet`` rows, fed by the record at ``offset``."""
        base = self._sids.take(state.height)
        with_sid = state.with_columns((pl.int_range(pl.len(), dtype=pl.Int64) + base).alias(SID))
        imported = aggregator.import_state(with_sid)
        spec, first, last = self._spec, pl.col(PARTIAL_FIRST), pl.col(PARTIAL_LAST)
        bucket = spec.bucket(first)
        meta = with_sid.select(
            SID, *aggregator.plan.keys, first.alias(FIRST), last.alias(LAST),
            spec.end(last, bucket).alias(END), bucket.alias(BUCKET),
            pl.lit(offset, pl.Int64).alias(SEQ), pl.lit(offset, pl.Int64).alias(LAST_SEQ),
            pl.lit(0, pl.Int64).alias(EARLY_REVISIONS), pl.lit(None, pl.Int64).alias(FRONTIER),
            first.alias(STATE_FIRST), last.alias(STATE_LAST),
            pl.lit(value=False).alias(SCATTERED), pl.lit(value=False).alias(KEPT),
            pl.lit(0, pl.Int64).alias(NEXT_REVISION),
            pl.lit([], pl.List(pl.Int64)).alias(REPLACES))
        return imported.join(meta, on=SID)

    # -- sessions out --------------------------------------------------------------------

    def close_due(self) -> tuple[list[ClosedWindow], int] | None:
        """The sessions the floor has passed, and the new emitted-through (None: it did
        not move). A session a late partial reopened goes out now even if the floor
        stands still (the stream may have ended): emitted-through then moves on by 1 ms,
        which is as true (a partial reaching a session that ends there revises it)."""
        if self.replaying():
            return None
        self._end_replay()
        floor = self._reports.floor()
        if self.reopened():
            assert self._emitted_through is not None  # noqa: S101 - reopened() says so
            floor = max(floor or self._emitted_through, self._emitted_through + 1)
        if floor is None or (self._emitted_through is not None
                             and floor <= self._emitted_through):
            return None
        self._emitted_through = floor
        if self._sessions is None or self._output is None:
            return [], floor
        # Under late: revise a session a late partial reopened goes out here too, as an
        # update (it ends at or before the floor already).
        due = self._sessions.pop(~pl.col(KEPT) & (pl.col(END) <= floor))
        windows = self._output.windows(due, final=True) if due.height else []
        if self._revising is None:
            self._sessions.forget(due)
        else:
            self._revising.closed(due)
            self._revising.expire(floor)
            self._revising.prune(self._offset(), floor)
        return self._early.saw(windows), floor

    def provisional(self) -> list[ClosedWindow]:
        """Early results: the open sessions that took in a partial since the last call,
        whole, provisional (none while a replay runs: the open sessions are not whole)."""
        if self.replaying():
            return []
        self._end_replay()
        if self._sessions is None or self._output is None:
            return []
        return self._early.emit(self._sessions, self._output, self._next or 0,
                                self._emitted_through)

    def late_windows(self) -> list[ClosedWindow]:
        """Late partial sessions since the last call, finalized, for the late topic."""
        late, self._late = self._late, []
        return late

    def keys(self) -> tuple[str, ...]:
        return () if self._aggregator is None else self._aggregator.plan.keys

    def commit_point(self) -> CommitPoint | None:
        """None while a session a late partial reopened waits to go out (till the next
        close_due): a replay would take it for an emitted one and lose its update."""
        if self._next is None or self.reopened():
            return None
        offset = self._offset()
        listed: tuple[tuple[int, int], ...] = ()
        kept = None
        if self._revising is not None:
            restored = self._listed if self.replaying() else {}
            listed = self._revising.listing(offset, self._emitted_through, restored,
                                            at_most=None) or ()
            frame = None if self._sessions is None else self._sessions.frame()
            kept = self._early.trimmed(self._revising.retention(), frame)
        elif self._revise_within_ms is not None:  # no record yet: what was restored
            listed, kept = tuple(sorted(self._listed.items())), self._restored_kept
        return CommitPoint(offset, CommitMetadata(
            self._emitted_through, max(self._reached, self._next or 0), None, closed=listed,
            kept_sessions=kept, revisions_through=self._early.revisions_through))

    def _offset(self) -> int:
        """The first record a restart must read: the oldest held session's first."""
        seqs = [s.min_seq() for s in (self._sessions, self._late_held) if s is not None]
        return min([self._next or 0, *(seq for seq in seqs if seq is not None)])

    def reopened(self) -> bool:
        """Whether a session a late partial reopened waits to go out."""
        frame = None if self._sessions is None else self._sessions.frame()
        if frame is None or self._emitted_through is None or self._revising is None:
            return False
        return frame.filter(~pl.col(KEPT) & (pl.col(END) <= self._emitted_through)).height > 0

    # -- state ---------------------------------------------------------------------------

    def replaying(self) -> bool:
        return self._replay_until >= 0 and (self._next is None
                                            or self._next < self._replay_until)

    def waiting(self) -> int:
        """Sessions held here, not yet complete (not those kept for revisions)."""
        frame = None if self._sessions is None else self._sessions.frame()
        return 0 if frame is None else frame.filter(~pl.col(KEPT)).height

    def holding_back(self) -> list[PartitionKey]:
        return self._reports.holding_back() if self.waiting() else []

    def groups(self) -> int:
        """Sessions held, kept ones included."""
        return 0 if self._sessions is None else len(self._sessions)

    def buffered_values(self) -> int:
        return 0 if self._values is None else self._values.count()


def _uniform(state: pl.DataFrame) -> pl.DataFrame:
    """Categorical keys as strings: each instance fixes its own encoding."""
    categorical = [n for n, t in state.schema.items() if isinstance(t, pl.Categorical)]
    return state.with_columns(pl.col(categorical).cast(pl.String)) if categorical else state

