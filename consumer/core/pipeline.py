"""The per-poll pipeline: input messages in; output records and commit points out.

One pass of the daemon's work, with no Kafka client in sight: decode each message (or
reject it to the dead-letter topic), add the poll's rows to the window engine, turn late
rows and closed windows into output records, and say which input offsets those records
let us commit. ``StreamProcessor`` (consumer/kafka/processor.py) feeds it what the
consumer returns and hands what it gives to the sink; the benchmarks call the same
object, so they measure the daemon's own code path. What its calls return, and the
interface the run loop sees, are in consumer/core/poll.py.

Time is a parameter (``now_ms``) of every call. The pipeline keeps what it produced
until the run loop says it is committed (``committed``), or throws it away with the
window state when a transaction is aborted or partitions move (``restart``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import polars as pl
import pyarrow as pa

from consumer.core.budget import GroupBudget
from consumer.core.decode import DecodedMessage, Decoder, RejectedMessageError, poll_frame
from consumer.core.dlq import DlqLimit, dead_letter, dead_rows
from consumer.core.emit import OutputSpec, ResultEmitter, WindowEmitter
from consumer.core.future_rows import REASON as FUTURE
from consumer.core.future_rows import split_future, without_future_progress
from consumer.core.late import late_records
from consumer.core.offsets import CommitMetadata
from consumer.core.plan import AggregationPlan
from consumer.core.poll import Consumed, Counters, Flush, Processed
from consumer.core.types import (
    ClosedWindow,
    InputMessage,
    MessageRef,
    OutputRecord,
    PartitionKey,
    partition_names,
)
from consumer.core.windows.engine import UnplannedEngine, WindowEngine
from wire.timestamps import rfc3339_ms

log = logging.getLogger(__name__)

# Builds the real engine once the first valid message has fixed the plan; the second
# argument is the Polars type of the event-time column (None for processing time).
EngineFactory = Callable[[AggregationPlan, pl.DataType | None], WindowEngine]


@dataclass
class _Assignment:
    committed: int | None
    metadata: CommitMetadata | None
    first_seen: int | None = None  # the first offset consumed since it was assigned

    def replayed(self, offset: int) -> bool:
        """Consumed, and its side output committed, before the last restart or
        rebalance (the position recorded in the commit metadata)."""
        return self.metadata is not None and offset < self.metadata.position


class Pipeline:
    def __init__(self, decoder: Decoder, build_engine: EngineFactory, routes: OutputSpec, *,
                 dlq_limit: DlqLimit, budget: GroupBudget, commit_interval_ms: int,
                 max_future_ms: int | None = None, emitter: WindowEmitter | None = None,
                 idle_timeout_ms: int | None = None, emit_every_ms: int | None = None) -> None:
        """``max_future_ms``: rows with event times after the wall clock plus this are
        dead-lettered (consumer/core/future_rows.py); None: no bound. ``emitter``: what
        closed windows become (default: results on the output topic).
        ``idle_timeout_ms``: when a partition without data counts as idle before the plan
        is known (progress reports only). ``emit_every_ms``: early results this often
        (processing time), None: none."""
        self._decoder = decoder
        self._build_engine = build_engine
        self._routes = routes
        self._dlq_limit = dlq_limit
        self._budget = budget
        self._commit_interval_ms = commit_interval_ms
        self._max_future_ms = max_future_ms
        self._emitter = emitter or ResultEmitter(routes)
        self._idle_timeout_ms = idle_timeout_ms
        self._engine: WindowEngine = UnplannedEngine(idle_timeout_ms=idle_timeout_ms)
        self._assigned: dict[PartitionKey, _Assignment] = {}
        self._pending: list[OutputRecord] = []  # built, not yet committed
        self._held: list[ClosedWindow] = []  # their records are pending; commits held back
        self._last_commit_ms: int | None = None
        self._emit_every_ms = emit_every_ms
        self._last_provisional_ms: int | None = None
        self.counters = Counters()

    # -- partitions ----------------------------------------------------------------------

    def assign(self, partition: PartitionKey, committed: int | None,
               metadata: CommitMetadata | None, now_ms: int) -> None:
        """``partition`` is ours from ``committed`` on (None: the group has no commit)."""
        self._assigned[partition] = _Assignment(committed, metadata)
        self._engine.assign(partition, committed, self._unpoisoned(metadata, now_ms), now_ms)

    def revoke(self, partition: PartitionKey) -> None:
        """``partition`` is no longer ours (revoked or lost)."""
        self._assigned.pop(partition, None)
        self._budget.forget([partition])
        self._engine.revoke(partition)

    def restart(self, committed: Mapping[PartitionKey, tuple[int | None, CommitMetadata | None]],
                now_ms: int) -> tuple[dict[PartitionKey, int | None], list[PartitionKey]]:
        """Throw away window state and uncommitted output; start again from ``committed``
        (what the group has committed for each partition we own).

        Returns where to seek each partition (None: its beginning) and the partitions to
        resume (paused for a state that is gone).
        """
        self._pending.clear()
        self._held.clear()
        released = self._budget.release_all()
        self._engine = UnplannedEngine(idle_timeout_ms=self._idle_timeout_ms)
        targets: dict[PartitionKey, int | None] = {}
        for partition, (offset, metadata) in committed.items():
            known = self._assigned.setdefault(partition, _Assignment(None, None))
            known.committed, known.metadata = offset, metadata
            targets[partition] = offset if offset is not None else known.first_seen
            self._engine.assign(partition, offset, self._unpoisoned(metadata, now_ms), now_ms)
        if self._decoder.plan is not None:
            self._engine = self._planned_engine(now_ms)
        return targets, released

    def _unpoisoned(self, metadata: CommitMetadata | None,
                    now_ms: int) -> CommitMetadata | None:
        if self._max_future_ms is None:
            return metadata
        return without_future_progress(metadata, now_ms + self._max_future_ms)

    def keep_alive(self, partitions: Iterable[PartitionKey], now_ms: int) -> None:
        """These partitions have input waiting on the broker: they are behind, not idle."""
        for partition in partitions:
            self._engine.keep_alive(partition, now_ms)

    # -- rows in -------------------------------------------------------------------------

    def process(self, messages: Sequence[InputMessage], now_ms: int) -> Processed:
        """Decode ``messages`` (one poll's, in order), window and pre-aggregate their rows."""
        tables: list[pa.Table] = []
        refs: list[MessageRef] = []
        sizes: list[int] = []
        rejected: list[str] = []
        rejected_rows: dict[str, int] = {}
        for message in messages:
            self.counters.messages += 1
            assignment = self._assigned.get(message.partition)
            if assignment is not None and assignment.first_seen is None:
                assignment.first_seen = message.offset
            try:
                decoded = self._decoder.decode(message.value, message.headers,
                                               where=_where(message))
            except RejectedMessageError as err:
                if self._reject(message, err, assignment):
                    rejected.append(err.reason)
                self._engine.skip(message.partition, message.offset, now_ms)
                self._dlq_limit.record(valid=False)
                continue
            self._dlq_limit.record(valid=True)
            decoded = self._without_future_rows(message, decoded, now_ms, rejected_rows)
            if decoded.table.num_rows == 0:  # feeds no window: done at once
                self._engine.skip(message.partition, message.offset, now_ms)
                continue
            if isinstance(self._engine, UnplannedEngine):
                self._engine = self._planned_engine(now_ms)
            tables.append(decoded.table)
            refs.append(MessageRef(message.partition, message.offset, decoded.table.num_rows,
                                   decoded.min_event_ms, decoded.max_event_ms,
                                   message.timestamp_ms))
            sizes.append(len(message.value or b""))
        if not tables:
            return Processed(rejected=rejected, rejected_rows=rejected_rows)
        late = self._engine.add(poll_frame(tables), refs, now_ms)
        # Counted once the rows are in the engine, never ahead of what the windows hold.
        self.counters.rows += sum(ref.rows for ref in refs)
        consumed = [Consumed(r.partition, r.rows, n) for r, n in zip(refs, sizes, strict=True)]
        late_rows = 0 if late is None else self._late(late, refs)
        return Processed(consumed, rejected, late_rows, rejected_rows)

    def _without_future_rows(self, message: InputMessage, decoded: DecodedMessage,
                             now_ms: int, rejected_rows: dict[str, int]) -> DecodedMessage:
        plan = self._decoder.plan
        if (self._max_future_ms is None or decoded.max_event_ms is None or plan is None
                or plan.time_column is None):
            return decoded
        bound_ms = now_ms + self._max_future_ms
        if decoded.max_event_ms <= bound_ms:
            return decoded  # the usual case: one comparison per message
        kept, future = split_future(decoded, plan.time_column, bound_ms)
        err = RejectedMessageError(FUTURE, f"{future.num_rows} of {decoded.table.num_rows} rows "
                                   f"have event times after {rfc3339_ms(bound_ms)}, the wall clock "
                                   "plus window.max_future_ms")
        topic, partition = message.partition
        log.warning("rejected rows of %s[%d]@%d: %s", topic, partition, message.offset, err)
        rejected_rows[FUTURE] = rejected_rows.get(FUTURE, 0) + future.num_rows
        self.counters.rejected_rows += future.num_rows
        if dlq := self._routes.dlq_topic:
            self._pending += dead_rows(message, future, err, topic=dlq,
                                       group_id=self._routes.group_id,
                                       max_bytes=self._routes.max_message_bytes)
        return kept

    def _planned_engine(self, now_ms: int) -> WindowEngine:
        plan = self._decoder.plan
        assert plan is not None  # noqa: S101 - called once a message fixed the plan
        engine = self._build_engine(plan, self._decoder.time_dtype())
        if isinstance(self._engine, UnplannedEngine):
            return self._engine.hand_over(engine, now_ms)
        return engine

    def _reject(self, message: InputMessage, err: RejectedMessageError,
                assignment: _Assignment | None) -> bool:
        """Dead-letter ``message``; False when it was dead-lettered before a restart."""
        where = _where(message)
        if assignment is not None and assignment.replayed(message.offset):
            # Its dead letter was committed then, with the output of the same
            # transaction: writing it again would duplicate it.
            log.debug("replayed %s was dead-lettered before: %s", where, err)
            return False
        self.counters.rejected += 1
        by_reason = self.counters.rejected_by_reason
        by_reason[err.reason] = by_reason.get(err.reason, 0) + 1
        log.warning("rejected %s: %s", where, err)
        if dlq := self._routes.dlq_topic:
            self._pending.append(dead_letter(message, err, topic=dlq,
                                             group_id=self._routes.group_id,
                                             max_bytes=self._routes.max_message_bytes))
        return True

    def _late(self, late: pl.DataFrame, refs: Sequence[MessageRef]) -> int:
        self.counters.late_rows += late.height
        if self._routes.drop_late:
            log.debug("%d late rows dropped (window.late: drop)", late.height)
        elif topic := self._routes.late_topic:
            routes = self._routes
            self._pending += late_records(late, refs, topic=topic, compression=routes.compression,
                                          max_bytes=routes.max_message_bytes)
        else:
            log.warning("%d late rows (no output.late_topic configured)", late.height)
        return late.height

    # -- records out ---------------------------------------------------------------------

    def flush(self, now_ms: int, *, force: bool = False) -> Flush:
        """Close what is due (and what the memory budget requires), and say whether a
        commit is due: windows closed, records waiting, the commit interval passed (with
        offsets to commit), or ``force`` (before a revoke or a stop)."""
        closed = self._engine.close_due(now_ms)
        pause, resume, early = self._keep_to_budget(now_ms)
        closed += early
        plan = self._decoder.plan
        # Early results are records, not windows emitted: nothing closed, nothing to count.
        for window in [*closed, *self._provisional(now_ms)]:
            assert plan is not None  # noqa: S101 - windows exist only once a plan does
            self._pending += self._emitter.window_records(window, plan)
        closed = self._held + closed
        offsets = self._engine.commit_points()
        if offsets is None:  # output held back (revisions wait for a replay): no commit
            self._held = closed
            return Flush(commit=False, records=[], offsets={}, windows=[], pause=pause,
                         resume=resume)
        self._held = []
        if self._last_commit_ms is None:
            self._last_commit_ms = now_ms  # the interval counts from the first turn
        interval_due = now_ms - self._last_commit_ms >= self._commit_interval_ms
        commit = bool(closed or self._pending or force or (interval_due and offsets))
        if commit or interval_due:
            self._pending += self._emitter.progress_records(self._engine.frontiers(now_ms),
                                                            closed)
        return Flush(commit or bool(self._pending), list(self._pending), offsets, closed,
                     pause, resume)

    def _provisional(self, now_ms: int) -> list[ClosedWindow]:
        every, last = self._emit_every_ms, self._last_provisional_ms
        if every is None or (last is not None and now_ms - last < every):
            return []
        self._last_provisional_ms = now_ms
        return self._engine.provisional(now_ms)

    def committed(self, flush: Flush, now_ms: int) -> None:
        """``flush``'s records and offsets are committed: forget them, move on."""
        # Nothing is added between flush() and this call: its records are a prefix.
        self._pending = self._pending[len(flush.records):]
        self._last_commit_ms = now_ms
        self.counters.windows_emitted += len(flush.windows)
        for partition, point in flush.offsets.items():
            if (assignment := self._assigned.get(partition)) is not None:
                assignment.committed, assignment.metadata = point.offset, point.metadata

    def _keep_to_budget(self, now_ms: int,
                        ) -> tuple[list[PartitionKey], list[PartitionKey], list[ClosedWindow]]:
        """Pause partitions that run ahead, resume them, or emit early (budget.py)."""
        groups, values = self._engine.cardinality(), self._engine.buffered_values()
        if self._budget.used(groups, values) >= 1:
            # Pending partials count a group once per part: a merge costs less than
            # emitting windows early for groups that are held once.
            self._engine.merge_pending()
            groups = self._engine.cardinality()
        decision = self._budget.check(groups, self._engine.ahead_of_watermark(now_ms),
                                      values=values)
        held = f"{groups} groups and {values} buffered values held"
        if decision.pause:
            log.warning("%s: pausing %s, ahead of the watermark, until windows close",
                        held, partition_names(decision.pause))
        if decision.resume:
            log.info("%s: resuming %s", held, partition_names(decision.resume))
        if not decision.emit_early:
            return decision.pause, decision.resume, []
        log.warning("%s (input.max_groups, input.max_buffered_values): emitting open windows "
                    "early", held)
        return decision.pause, decision.resume, self._engine.emit_early(now_ms)

    # -- state ---------------------------------------------------------------------------

    def assigned(self) -> dict[PartitionKey, int | None]:
        """Each partition we own, with its committed offset (None: none yet)."""
        return {partition: a.committed for partition, a in self._assigned.items()}

    def replaying(self) -> bool:
        """Some partition is still re-reading input from before a restart."""
        return any(self._engine.replaying(partition) for partition in self._assigned)

    def open_windows(self) -> int:
        return self._engine.open_window_count()

    def groups(self) -> int:
        return self._engine.cardinality()

    def pending_records(self) -> int:
        return len(self._pending)

    def paused(self) -> int:
        return len(self._budget.paused)

    def waiting_windows(self) -> int:
        """Windows held for completeness elsewhere: none, on one instance."""
        return 0

    def holding_back(self) -> list[PartitionKey]:
        return []


def _where(message: InputMessage) -> str:
    topic, partition = message.partition
    return f"{topic}[{partition}]@{message.offset}"
