"""The run loop: poll → pipeline → commit, and the rebalances around it.

Shaped after librdkafka's examples/transactions.c: offsets are committed with the output
they depend on; on a revoke the current results are committed first; on a lost
assignment or an aborted transaction the window state is thrown away and rebuilt by
replaying the input from the committed offsets (``docs/design.md`` explains why this keeps
state and offsets consistent). What happens to the messages themselves is the pipeline's
business (consumer/core/pipeline.py); this module only moves them between the consumer,
the pipeline and the sink, which it is given (``consumer/compose.py`` builds them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, Message, TopicPartition

from consumer.config import ProcessingSettings
from consumer.core.emit import emitted_lines
from consumer.core.offsets import CommitMetadata, CommitPoint
from consumer.core.poll import Counters, Flush, PollPipeline
from consumer.core.types import InputMessage, PartitionKey, partition_names
from consumer.kafka.clients import InputConsumer, take_batch
from consumer.kafka.sink import AbortRequiredError, FatalKafkaError, OutputSink
from consumer.service.observer import NullObserver, ProcessorObserver

log = logging.getLogger(__name__)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class TurnSnapshot:
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


class StreamProcessor:
    def __init__(self, consumer: InputConsumer, sink: OutputSink, pipeline: PollPipeline, *,
                 topics: list[str], processing: ProcessingSettings,
                 observer: ProcessorObserver | None = None,
                 clock: Callable[[], int] = now_ms) -> None:
        self._consumer = consumer
        self._sink = sink
        self._pipeline = pipeline
        self._topics = topics
        self._processing = processing
        self._observer: ProcessorObserver = observer or NullObserver()
        self._clock = clock
        self._paused: set[PartitionKey] = set()  # for the memory budget (core/budget.py)
        self._rewind_needed = False
        self._fatal: FatalKafkaError | None = None  # met inside a rebalance callback
        self._closing = False
        self._stop = False
        self.progress = TurnSnapshot(0, Counters(), 0, 0, ready=False)

    @property
    def counters(self) -> Counters:
        return self._pipeline.counters

    def is_ready(self) -> bool:
        """Assigned, and no partition is still replaying input from before a restart."""
        return bool(self._pipeline.assigned()) and not self._pipeline.replaying()

    def request_stop(self) -> None:
        self._stop = True

    def run(self) -> None:
        """Consume until ``request_stop``; commit what is done; close the clients."""
        self.subscribe()
        try:
            while not self._stop:
                self.run_once()
            self._flush(force=True)
        finally:
            self.close()

    def subscribe(self) -> None:
        self._consumer.subscribe(self._topics, on_assign=self._on_assign,
                                 on_revoke=self._on_revoke, on_lost=self._on_lost)

    def run_once(self) -> None:
        """One turn of the loop: poll, process, flush (``run`` repeats it)."""
        processing = self._processing
        messages = take_batch(self._consumer, processing.poll_max_messages,
                              processing.poll_timeout_ms / 1000)
        if self._fatal is not None:
            raise self._fatal
        if self._rewind_needed:
            self._rewind()  # what this poll returned predates the rewind
            return
        self._process(self._hold_back_paused(messages))
        self._keep_backlogged_alive()
        self._flush()
        self._report()

    def close(self) -> None:
        self._closing = True
        self._consumer.close()
        self._sink.close()

    # -- rebalance callbacks (called from inside poll()) ------------------------------

    def _on_assign(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        committed = self._consumer.committed(partitions, timeout=30) if partitions else []
        now = self._clock()
        for tp in committed:
            self._pipeline.assign((tp.topic, tp.partition), tp.offset if tp.offset >= 0 else None,
                                  CommitMetadata.decode(tp.metadata), now)
        log.info("assigned %s", _names(partitions))
        self._observer.assigned([(tp.topic, tp.partition) for tp in partitions])

    def _on_revoke(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        log.info("revoked %s", _names(partitions))
        self._observer.revoked([(tp.topic, tp.partition) for tp in partitions])
        self._observer.rebalanced()
        if not self._rewind_needed and not self._closing:
            try:
                self._flush(force=True)  # commit what is done before the partitions go
            except FatalKafkaError as err:
                # Raised from the loop, never through librdkafka's callback: an exception
                # left pending in the client broke the producer's flush on close (a
                # SystemError and a traceback instead of the one line for a fenced zombie).
                self._fatal = err
        self._forget(partitions)
        # Open windows hold rows of the revoked partitions, which their new owner replays:
        # rebuild ours from the committed offsets of what we keep.
        if not self._closing:
            self._rewind_needed = True

    def _on_lost(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        log.warning("lost %s: discarding window state", _names(partitions))
        self._observer.revoked([(tp.topic, tp.partition) for tp in partitions])
        self._observer.rebalanced()
        self._forget(partitions)
        self._rewind_needed = True

    def _forget(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._pipeline.revoke((tp.topic, tp.partition))
            self._paused.discard((tp.topic, tp.partition))

    # -- one turn ----------------------------------------------------------------------

    def _hold_back_paused(self, messages: list[Message]) -> list[Message]:
        """Drop the messages of partitions we paused, and seek back to the first of them.

        librdkafka pauses asynchronously: a poll right after ``pause`` may still return
        messages fetched before, and one more poll of a partition far ahead can push the
        groups held past ``input.max_groups``. They are read again after ``resume``.
        """
        if not self._paused:
            return messages
        kept: list[Message] = []
        first_held: dict[PartitionKey, int] = {}
        for message in messages:
            key = (message.topic() or "", message.partition() or 0)
            if key in self._paused and message.error() is None:
                first_held.setdefault(key, message.offset() or 0)
            else:
                kept.append(message)
        for (topic, partition), offset in first_held.items():
            self._consumer.seek(TopicPartition(topic, partition, offset))
        return kept

    def _process(self, messages: list[Message]) -> None:
        inputs = []
        for message in messages:
            error = message.error()
            if error is not None:
                self._client_error(error)
                continue
            _kind, timestamp = message.timestamp()
            inputs.append(InputMessage(
                (message.topic() or "", message.partition() or 0), message.offset() or 0,
                message.value(), message.key(), _header_pairs(message), timestamp))
        if not inputs:
            return
        done = self._pipeline.process(inputs, self._clock())
        for consumed in done.consumed:
            self._observer.consumed(consumed.partition, 1, consumed.rows, consumed.nbytes)
        for reason in done.rejected:
            self._observer.rejected(reason)
        for reason, rows in done.rejected_rows.items():
            self._observer.rejected_rows(reason, rows)
        if done.late_rows:
            self._observer.late(done.late_rows)

    def _keep_backlogged_alive(self) -> None:
        """A partition with input waiting on the broker is behind, not idle: without this
        a backlog (or a slow fetch) would close windows early and turn its rows late."""
        assigned = self._pipeline.assigned()
        if not assigned:
            return
        positions = self._consumer.position([TopicPartition(t, p) for t, p in assigned])
        behind = []
        for tp in positions:
            key = (tp.topic, tp.partition)
            low, high = self._consumer.get_watermark_offsets(tp, cached=True)
            position = tp.offset
            if position < 0:  # nothing consumed from it yet: it starts at its commit
                committed = assigned.get(key)
                position = committed if committed is not None else low
            if high > position:
                behind.append(key)
        self._pipeline.keep_alive(behind, self._clock())

    def _flush(self, *, force: bool = False) -> None:
        now = self._clock()
        flush = self._pipeline.flush(now, force=force)
        if flush.pause:
            self._consumer.pause(_topic_partitions(flush.pause))
            self._paused.update(flush.pause)
        if flush.resume:
            self._consumer.resume(_topic_partitions(flush.resume))
            self._paused.difference_update(flush.resume)
        if not flush.commit:
            return
        try:
            self._sink.flush(flush.records, _offsets(flush.offsets), self._consumer)
        except AbortRequiredError as err:
            self.counters.aborts += 1
            self._observer.aborted()
            log.warning("nothing committed (%s): replaying from the committed offsets", err)
            self._rewind_needed = True
            return
        self._pipeline.committed(flush, now)
        self.counters.commits += 1
        self._observer.committed(flush.windows, now, self._clock())
        _log_emitted(flush)

    def _report(self) -> None:
        self._observer.loop_turned(self._clock())
        pipeline = self._pipeline
        ready = self.is_ready()
        self._observer.state(open_windows=pipeline.open_windows(), groups=pipeline.groups(),
                             ready=ready, paused=pipeline.paused())
        self._observer.completeness(pipeline.waiting_windows(), pipeline.holding_back())
        self.progress = TurnSnapshot(self.progress.turns + 1, self.counters.copy(),
                                     pipeline.open_windows(), pipeline.pending_records(), ready)

    # -- recovery ----------------------------------------------------------------------

    def _rewind(self) -> None:
        """Throw away window state; replay every assigned partition from its commit."""
        self._rewind_needed = False
        assignment = self._consumer.assignment()
        committed = self._consumer.committed(assignment, timeout=30) if assignment else []
        points = {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None,
                                             CommitMetadata.decode(tp.metadata))
                  for tp in committed}
        targets, released = self._pipeline.restart(points, self._clock())
        if released:  # the state they were paused for is gone
            self._consumer.resume(_topic_partitions(released))
            self._paused.difference_update(released)
        for (topic, partition), offset in targets.items():
            target = OFFSET_BEGINNING if offset is None else offset
            self._consumer.seek(TopicPartition(topic, partition, target))
        log.info("rewound %d partitions to their committed offsets", len(targets))

    def _client_error(self, error: KafkaError) -> None:
        # A consumer's fatal error (a static member fenced by another with the same
        # group.instance.id, say) arrives as an error event of code _FATAL, whose
        # fatal() is False: left as a warning, it kept a dead consumer's daemon running.
        if error.fatal() or error.code() == KafkaError._FATAL:
            raise FatalKafkaError(f"consumer: {error.str()}")
        log.warning("consumer error: %s", error.str())


def _header_pairs(message: Message) -> list[tuple[str, str | bytes | None]] | None:
    headers = message.headers()
    if headers is None:
        return None
    return list(headers.items()) if isinstance(headers, dict) else list(headers)


def _offsets(points: dict[PartitionKey, CommitPoint]) -> list[TopicPartition]:
    return [TopicPartition(topic, partition, point.offset, metadata=point.metadata.encode())
            for (topic, partition), point in points.items()]


def _topic_partitions(keys: list[PartitionKey]) -> list[TopicPartition]:
    return [TopicPartition(topic, partition) for topic, partition in keys]


def _names(partitions: list[TopicPartition]) -> str:
    return partition_names((tp.topic, tp.partition) for tp in partitions)


def _log_emitted(flush: Flush) -> None:
    for line in emitted_lines(flush.windows):
        log.info("%s", line)
