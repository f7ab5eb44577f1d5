"""The run loop: consume → decode → window/aggregate → emit → commit, and rebalances.

Shaped after librdkafka's examples/transactions.c: offsets are committed with the output
they depend on; on a revoke the current results are committed first; on a lost
assignment or an aborted transaction the window state is thrown away and rebuilt by
replaying the input from the committed offsets (``docs/design.md`` explains why this keeps
state and offsets consistent).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import polars as pl
import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from consumer.config import Settings
from consumer.core.budget import GroupBudget
from consumer.core.decode import DecodedMessage, Decoder, RejectedMessageError, poll_frame
from consumer.core.dlq import DlqLimit, dead_letter
from consumer.core.engine.base import WindowEngine
from consumer.core.engine.count import CountWindowEngine
from consumer.core.engine.time import TimeWindowEngine
from consumer.core.offsets import CommitMetadata, CommitPoint
from consumer.core.plan import AggregationPlan, derive_plan
from consumer.core.types import ClosedWindow, MessageRef, OutputRecord, PartitionKey
from consumer.core.windows import WindowSpec
from consumer.kafka.clients import consumer_config, producer_config, take_batch
from consumer.kafka.sink import (
    AbortRequiredError,
    AtLeastOnceSink,
    FatalKafkaError,
    OutputSink,
    TransactionalSink,
)
from consumer.service.observer import NullObserver, ProcessorObserver
from wire.input import DecodeLimits, encode_ipc_stream
from wire.output import encode_window

log = logging.getLogger(__name__)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Counters:
    messages: int = 0
    rows: int = 0  # rows the engine has taken (in a window, or found late); replays count again
    rejected: int = 0
    windows_emitted: int = 0  # in committed transactions
    late_rows: int = 0
    commits: int = 0
    aborts: int = 0
    rejected_by_reason: dict[str, int] = field(default_factory=dict)

    def copy(self) -> Counters:
        return replace(self, rejected_by_reason=dict(self.rejected_by_reason))


@dataclass(frozen=True)
class Progress:
    """Where the daemon stood at the end of a turn of its loop: one consistent view.

    Another thread (a test, the bench) must read this, not the processor's attributes:
    mid-turn, rows can be counted but not yet in a window, or a window closed but its
    output not yet committed, and a condition over several attributes can hold for a
    moment that means nothing.
    """

    turns: int
    counters: Counters
    open_windows: int
    pending_output: int  # records built, not yet committed
    ready: bool

    @property
    def settled(self) -> bool:
        """Nothing open and nothing waiting for a commit: all taken input is in output."""
        return self.open_windows == 0 and self.pending_output == 0


@dataclass
class _Assigned:
    committed: int | None
    metadata: CommitMetadata | None
    first_seen: int | None = None


class StreamProcessor:
    def __init__(self, settings: Settings, *, sink: OutputSink | None = None,
                 observer: ProcessorObserver | None = None,
                 clock: Callable[[], int] = now_ms) -> None:
        self._settings = settings
        self._clock = clock
        self._observer: ProcessorObserver = observer or NullObserver()
        config = consumer_config(settings.kafka, settings.processing)
        if settings.service.statistics_interval_ms:
            config["statistics.interval.ms"] = settings.service.statistics_interval_ms
            config["stats_cb"] = self._observer.statistics
        self._consumer = Consumer(config)
        self._sink = sink or self._make_sink()
        self._decoder = Decoder(
            self._make_plan,
            limits=DecodeLimits(max_rows=settings.input.max_rows_per_message,
                                max_decoded_bytes=settings.input.max_decoded_bytes_per_message),
            max_message_bytes=settings.input.max_message_bytes,
        )
        self._dlq_limit = DlqLimit(settings.dlq_limit)
        self._budget = GroupBudget(settings.input.max_groups, settings.input.over_budget)
        self._engine: WindowEngine | None = None
        # Messages rejected before the first valid one fixed the plan (and so the engine).
        self._rejected_before_plan: list[tuple[PartitionKey, int]] = []
        self._assigned: dict[PartitionKey, _Assigned] = {}
        self._pending: list[OutputRecord] = []
        self._rewind_needed = False
        self._closing = False
        self._stop = False
        self._last_commit_ms = self._clock()
        self.counters = Counters()
        self.progress = Progress(0, Counters(), 0, 0, ready=False)

    def _make_sink(self) -> OutputSink:
        config = producer_config(self._settings.kafka, self._settings.processing)
        if self._settings.processing.guarantee == "exactly_once":
            return TransactionalSink(config)
        return AtLeastOnceSink(config)

    def _make_plan(self, schema: pa.Schema) -> AggregationPlan:
        window, aggregation = self._settings.window, self._settings.aggregation
        return derive_plan(
            schema,
            time_column=window.timestamp_column if window.time == "event" else None,
            keys=aggregation.keys, overrides=aggregation.columns,
        )

    # -- lifecycle ---------------------------------------------------------------------

    def is_ready(self) -> bool:
        """Assigned, and no partition is still replaying input from before a restart."""
        if not self._assigned:
            return False
        return all(self._engine is None or not self._engine.replaying(key)
                   for key in self._assigned)

    def request_stop(self) -> None:
        self._stop = True

    def run(self) -> None:
        self._consumer.subscribe(self._settings.input.topics, on_assign=self._on_assign,
                                 on_revoke=self._on_revoke, on_lost=self._on_lost)
        try:
            while not self._stop:
                processing = self._settings.processing
                messages = take_batch(self._consumer, processing.poll_max_messages,
                                      processing.poll_timeout_ms / 1000)
                if self._rewind_needed:
                    self._rewind()  # what this poll returned predates the rewind
                    continue
                self._process(messages)
                self._keep_backlogged_alive()
                self._flush_due()
                self._report()
            self._flush_due(force=True)
        finally:
            self._closing = True
            self._consumer.close()
            self._sink.close()

    # -- rebalance callbacks (called from inside poll()) ------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        committed = consumer.committed(partitions, timeout=30) if partitions else []
        for tp in committed:
            key = (tp.topic, tp.partition)
            offset = tp.offset if tp.offset >= 0 else None
            meta = CommitMetadata.decode(tp.metadata)
            self._assigned[key] = _Assigned(offset, meta)
            if self._engine is not None:
                self._engine.assign(key, offset, meta, self._clock())
        log.info("assigned %s", _names(partitions))
        self._observer.assigned([(tp.topic, tp.partition) for tp in partitions])

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("revoked %s", _names(partitions))
        self._observer.revoked([(tp.topic, tp.partition) for tp in partitions])
        self._observer.rebalanced()
        if self._engine is not None and not self._rewind_needed and not self._closing:
            self._flush_due(force=True)  # commit what is done before the partitions go
        for tp in partitions:
            self._forget((tp.topic, tp.partition))
        # Open windows hold rows of the revoked partitions, which their new owner replays:
        # rebuild ours from the committed offsets of what we keep.
        if not self._closing:
            self._rewind_needed = True

    def _on_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.warning("lost %s: discarding window state", _names(partitions))
        self._observer.revoked([(tp.topic, tp.partition) for tp in partitions])
        self._observer.rebalanced()
        for tp in partitions:
            self._forget((tp.topic, tp.partition))
        self._rewind_needed = True

    def _forget(self, key: PartitionKey) -> None:
        self._assigned.pop(key, None)
        self._budget.forget([key])
        if self._engine is not None:
            self._engine.revoke(key)

    # -- rows in -----------------------------------------------------------------------

    def _process(self, messages: list[Message]) -> None:
        now = self._clock()
        tables: list[pa.Table] = []
        refs: list[MessageRef] = []
        sizes: list[int] = []
        for message in messages:
            error = message.error()
            if error is not None:
                self._client_error(error)
                continue
            decoded = self._decode(message, now)
            if decoded is None:
                continue
            key = (message.topic() or "", message.partition() or 0)
            rows = decoded.table.num_rows
            tables.append(decoded.table)
            refs.append(MessageRef(key, message.offset() or 0, rows, decoded.min_event_ms,
                                   decoded.max_event_ms))
            sizes.append(len(message.value() or b""))
        if not tables:
            return
        late = self._require_engine().add(poll_frame(tables), refs, now)
        # Counted once the rows are in the engine, so "rows consumed" never runs ahead of
        # what the windows hold.
        for ref, nbytes in zip(refs, sizes, strict=True):
            self.counters.rows += ref.rows
            self._observer.consumed(ref.partition, 1, ref.rows, nbytes)
        if late is not None:
            self._late(late)

    def _decode(self, message: Message, now: int) -> DecodedMessage | None:
        self.counters.messages += 1
        key = (message.topic() or "", message.partition() or 0)
        offset = message.offset() or 0
        assigned = self._assigned.get(key)
        if assigned is not None and assigned.first_seen is None:
            assigned.first_seen = offset
        try:
            decoded = self._decoder.decode(message.value(), message.headers())
        except RejectedMessageError as err:
            self._reject(message, err, replayed=_replayed(assigned, offset))
            if self._engine is not None:
                self._engine.skip(key, offset, now)
            else:  # no plan yet: the engine learns of it when it is built
                self._rejected_before_plan.append((key, offset))
            self._dlq_limit.record(valid=False)
            return None
        self._dlq_limit.record(valid=True)
        self._require_engine()  # before the next message, so a rejection is recorded
        return decoded

    def _require_engine(self) -> WindowEngine:
        if self._engine is None:
            self._engine = self._build_engine()
        return self._engine

    def _build_engine(self) -> WindowEngine:
        plan = self._decoder.plan
        assert plan is not None  # noqa: S101 - built after the first decoded message
        window, processing = self._settings.window, self._settings.processing
        engine: WindowEngine
        if window.kind == "count":
            engine = CountWindowEngine(plan, batches=window.count_batches, rows=window.count_rows,
                                       idle_timeout_ms=window.idle_timeout_ms,
                                       merge_every=processing.merge_every_batches)
        else:
            assert window.size_ms is not None  # noqa: S101 - checked by the config model
            spec = WindowSpec(window.size_ms, window.step_ms or window.size_ms)
            time_dtype = self._decoder.time_dtype()
            engine = TimeWindowEngine(
                plan, spec, event_time=window.time == "event", time_dtype=time_dtype,
                allowed_lateness_ms=window.allowed_lateness_ms,
                idle_timeout_ms=window.idle_timeout_ms, merge_every=processing.merge_every_batches)
        now = self._clock()
        for key, assigned in self._assigned.items():
            engine.assign(key, assigned.committed, assigned.metadata, now)
        for key, offset in self._rejected_before_plan:
            if key in self._assigned:
                engine.skip(key, offset, now)
        self._rejected_before_plan.clear()
        return engine

    # -- records out -------------------------------------------------------------------

    def _reject(self, message: Message, err: RejectedMessageError, *, replayed: bool) -> None:
        where = f"{message.topic()}[{message.partition()}]@{message.offset()}"
        if replayed:
            # Rejected before the restart too, and its dead letter committed then, with
            # the output of the same transaction: writing it again would duplicate it.
            log.debug("replayed %s was dead-lettered before: %s", where, err)
            return
        self.counters.rejected += 1
        by_reason = self.counters.rejected_by_reason
        by_reason[err.reason] = by_reason.get(err.reason, 0) + 1
        self._observer.rejected(err.reason)
        log.warning("rejected %s: %s", where, err)
        if topic := self._settings.output.dlq_topic:
            self._pending.append(dead_letter(message, err, topic=topic,
                                             group_id=self._settings.kafka.group_id))

    def _late(self, late: pl.DataFrame) -> None:
        self.counters.late_rows += late.height
        self._observer.late(late.height)
        topic = self._settings.output.late_topic
        if topic:
            self._pending.append(OutputRecord(topic, None, encode_ipc_stream(late.to_arrow()), []))
        else:
            log.warning("%d late rows (no output.late_topic configured)", late.height)

    def _flush_due(self, *, force: bool = False) -> None:
        if self._engine is None and not self._pending:
            return
        now = self._clock()
        output = self._settings.output
        closed = self._engine.close_due(now) if self._engine is not None else []
        if self._engine is not None:
            closed += self._keep_to_budget(self._engine, now)
        for window in closed:
            for msg in encode_window(window, fmt=output.format, compression=output.compression,
                                     max_bytes=output.max_message_bytes,
                                     revision=window.revision, final=window.final):
                self._pending.append(OutputRecord(output.topic, msg.key, msg.value, msg.headers))
        interval_due = now - self._last_commit_ms >= self._settings.processing.commit_interval_ms
        if not (closed or self._pending or interval_due or force):
            return
        offsets = self._commit_offsets()
        try:
            self._sink.flush(self._pending, offsets, self._consumer)
        except AbortRequiredError as err:
            self.counters.aborts += 1
            self._observer.aborted()
            log.warning("nothing committed (%s): replaying from the committed offsets", err)
            self._rewind_needed = True
            return
        self._pending = []  # only now: pending means "not yet committed"
        self.counters.commits += 1
        self.counters.windows_emitted += len(closed)
        self._observer.committed(closed, now, self._clock())
        self._last_commit_ms = now
        for tp in offsets:
            assigned = self._assigned.get((tp.topic, tp.partition))
            if assigned is not None:
                assigned.committed = tp.offset
                assigned.metadata = CommitMetadata.decode(tp.metadata)
        for window in closed:
            log.info("emitted window [%d, %d): %d groups from %d rows", window.start_ms,
                     window.end_ms, window.frame.height, window.input_rows)

    def _keep_to_budget(self, engine: WindowEngine, now: int) -> list[ClosedWindow]:
        """Pause partitions that run ahead, resume them, or emit early (consumer/core/budget.py)."""
        groups = engine.cardinality()
        decision = self._budget.check(groups, engine.ahead_of_watermark(now))
        if decision.pause:
            log.warning("%d groups held: pausing %s, ahead of the watermark, until windows "
                        "close", groups, _keys(decision.pause))
            self._consumer.pause(_partitions(decision.pause))
        if decision.resume:
            log.info("%d groups held: resuming %s", groups, _keys(decision.resume))
            self._consumer.resume(_partitions(decision.resume))
        if not decision.emit_early:
            return []
        log.warning("%d groups held (input.max_groups = %d): emitting open windows early",
                    groups, self._settings.input.max_groups)
        return engine.emit_early(now)

    def _keep_backlogged_alive(self) -> None:
        """A partition with input waiting on the broker is behind, not idle: without this
        a backlog (or a slow fetch) would close windows early and turn its rows late."""
        if self._engine is None or not self._assigned:
            return
        now = self._clock()
        positions = self._consumer.position(
            [TopicPartition(t, p) for t, p in self._assigned])
        for tp in positions:
            key = (tp.topic, tp.partition)
            low, high = self._consumer.get_watermark_offsets(tp, cached=True)
            position = tp.offset
            if position < 0:  # nothing consumed from it yet: it starts at its commit
                committed = self._assigned[key].committed if key in self._assigned else None
                position = committed if committed is not None else low
            if high > position:
                self._engine.keep_alive(key, now)

    def _report(self) -> None:
        self._observer.loop_turned(self._clock())
        engine = self._engine
        open_windows = 0 if engine is None else engine.open_window_count()
        ready = self.is_ready()
        self._observer.state(open_windows=open_windows,
                             groups=0 if engine is None else engine.cardinality(),
                             ready=ready, paused=len(self._budget.paused))
        self.progress = Progress(self.progress.turns + 1, self.counters.copy(), open_windows,
                                 len(self._pending), ready)

    def _commit_offsets(self) -> list[TopicPartition]:
        points = (self._engine.commit_points() if self._engine is not None
                  else self._past_rejections())
        return [
            TopicPartition(topic, partition, point.offset, metadata=point.metadata.encode())
            for (topic, partition), point in points.items()
        ]

    def _past_rejections(self) -> dict[PartitionKey, CommitPoint]:
        """Before any valid message, everything consumed was dead-lettered: commit past it
        (keeping the earlier commit's frontier), so a restart does not dead-letter it again."""
        furthest: dict[PartitionKey, int] = {}
        for key, offset in self._rejected_before_plan:
            furthest[key] = max(furthest.get(key, offset), offset)
        points = {}
        for key, offset in furthest.items():
            assigned = self._assigned.get(key)
            if assigned is None:
                continue
            before = assigned.metadata or CommitMetadata(None, 0, None)
            metadata = replace(before, position=max(before.position, offset + 1))
            points[key] = CommitPoint(offset + 1, metadata)
        return points

    # -- recovery ----------------------------------------------------------------------

    def _rewind(self) -> None:
        """Throw away window state; replay every assigned partition from its commit."""
        self._rewind_needed = False
        self._pending.clear()
        self._rejected_before_plan.clear()
        if released := self._budget.release_all():  # the state they were paused for is gone
            self._consumer.resume(_partitions(released))
        assignment = self._consumer.assignment()
        committed = self._consumer.committed(assignment, timeout=30) if assignment else []
        for tp in committed:
            key = (tp.topic, tp.partition)
            known = self._assigned.setdefault(key, _Assigned(None, None))
            known.committed = tp.offset if tp.offset >= 0 else None
            known.metadata = CommitMetadata.decode(tp.metadata)
            target = known.committed
            if target is None:
                target = known.first_seen if known.first_seen is not None else OFFSET_BEGINNING
            self._consumer.seek(TopicPartition(tp.topic, tp.partition, target))
        self._engine = self._build_engine() if self._decoder.plan is not None else None
        log.info("rewound %d partitions to their committed offsets", len(committed))

    def _client_error(self, error: KafkaError) -> None:
        if error.fatal():
            raise FatalKafkaError(f"consumer: {error.str()}")
        log.warning("consumer error: %s", error.str())


def _replayed(assigned: _Assigned | None, offset: int) -> bool:
    """Whether the message was consumed, and its side output committed, before the last
    restart or rebalance (the position recorded in the commit metadata)."""
    return (assigned is not None and assigned.metadata is not None
            and offset < assigned.metadata.position)


def _partitions(keys: list[PartitionKey]) -> list[TopicPartition]:
    return [TopicPartition(topic, partition) for topic, partition in keys]


def _keys(keys: list[PartitionKey]) -> str:
    return ", ".join(f"{topic}[{partition}]" for topic, partition in keys)


def _names(partitions: list[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions) or "nothing"
