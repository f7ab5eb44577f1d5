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
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, TopicPartition

from consumer.config import ProcessingSettings
from consumer.core.emit import emitted_lines
from consumer.core.offsets import CommitMetadata, CommitPoint
from consumer.core.poll import Counters, Flush, PollPipeline, TurnSnapshot
from consumer.core.types import InputMessage, PartitionKey, partition_names
from consumer.kafka.backlog import BacklogCheck
from consumer.kafka.clients import InputConsumer, RebalanceCallback, take_batch
from consumer.kafka.errors import FatalKafkaError, described, stop_if_fatal
from consumer.kafka.rewind import COMMITTED_TIMEOUT_S, RewindAttempts
from consumer.kafka.sink import AbortRequiredError, OutputSink
from consumer.service.observer import NullObserver, ProcessorObserver

log = logging.getLogger(__name__)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


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
        self._rewind_attempts = RewindAttempts(clock)
        self._offsets_lookup_failed = False  # in this turn's poll: the rewind waits a turn
        self._fatal: BaseException | None = None  # met inside a rebalance callback
        self._backlog = BacklogCheck(consumer, poll_timeout_ms=processing.poll_timeout_ms,
                                     clock=clock)
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
        try:
            self.subscribe()
            while not self._stop:
                self.run_once()
            if self._rewind_needed:
                # The state is to be rebuilt from the commits: it may hold rows of
                # partitions revoked since (their new owners read them again), so
                # none of it is ours to emit. The next owners replay from the commits.
                log.info("stopping with a rewind pending: nothing more is committed")
            else:
                self._flush(force=True)
        except KafkaException as exc:
            # Every call site answers the errors it can meet (consumer/kafka/errors.py);
            # one that gets here is none of those: stop in one line, not a traceback.
            raise FatalKafkaError(described(exc.args[0])) from exc
        finally:
            self.close()

    def subscribe(self) -> None:
        self._consumer.subscribe(self._topics, on_assign=self._guarded(self._on_assign),
                                 on_revoke=self._guarded(self._on_revoke),
                                 on_lost=self._guarded(self._on_lost))

    def run_once(self) -> None:
        """One turn of the loop: poll, process, flush (``run`` repeats it)."""
        processing = self._processing
        self._offsets_lookup_failed = False
        try:
            messages = take_batch(self._consumer, processing.poll_max_messages,
                                  processing.poll_timeout_ms / 1000)
        except KafkaException as exc:
            self._client_error(exc.args[0])
            return
        if self._fatal is not None:
            raise self._fatal
        # The client's own error events first: a rewind or a paused partition drops the
        # poll's messages, and librdkafka delivers an event (a fatal fence) only once.
        messages = self._data_only(messages)
        if not self._rewind_needed:
            messages = self._hold_back_paused(messages)
        if self._rewind_needed:
            if not self._offsets_lookup_failed:  # one wait for the offsets between two polls
                self._rewind()  # what this poll returned predates the rewind
            self._observer.loop_turned(self._clock())  # turning, if only to rewind
            return
        self._process(messages)
        # One instant for the backlog check and the flush: the check's "no backlog" holds
        # at the time read before it, so idleness is judged then. A stall between the two
        # (SIGSTOP, a starved core) read after it closed windows on input that came during
        # the stall, and turned it late.
        now = self._clock()
        self._keep_backlogged_alive(now)
        self._flush(now)
        self._report()

    def close(self) -> None:
        self._closing = True
        try:
            self._consumer.close()  # leaves the group; its revoke callback runs in here
        except KafkaException as exc:  # leaving is best effort: the session times out
            log.info("consumer closed with an error: %s", exc.args[0].str())
        finally:
            self._sink.close()

    # -- rebalance callbacks (called from inside poll()) ------------------------------

    def _guarded(self, callback: RebalanceCallback) -> RebalanceCallback:
        """``callback`` as librdkafka must get it: raising nothing. librdkafka keeps an
        exception raised in a callback pending in C, where it breaks later client calls
        (the producer's flush on close, say); the loop raises it after the poll."""

        def guarded(consumer: Any, partitions: list[TopicPartition]) -> None:
            try:
                callback(consumer, partitions)
            except KafkaException as exc:
                self._fatal = FatalKafkaError(described(exc.args[0]))
            except Exception as err:  # noqa: BLE001 - re-raised by the loop, not lost
                self._fatal = err

        return guarded

    def _on_assign(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        try:
            committed = (self._consumer.committed(partitions, timeout=COMMITTED_TIMEOUT_S)
                         if partitions else [])
        except KafkaException as exc:
            # The partitions are ours, from offsets we cannot read now (not yet stable, or
            # no coordinator): take them as uncommitted and rewind, which reads the
            # offsets again, on the next turns, before any message is used.
            self._rewind_later("reading the committed offsets", exc.args[0])
            self._offsets_lookup_failed = True
            committed = partitions
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
            finally:
                self._forget(partitions)  # a fatal error is raised from the loop
        else:
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
            if key in self._paused:
                first_held.setdefault(key, message.offset() or 0)
            else:
                kept.append(message)
        for (topic, partition), offset in first_held.items():
            try:
                self._consumer.seek(TopicPartition(topic, partition, offset))
            except KafkaException as exc:
                # The held messages would be skipped: replay them, and all, from the
                # commit (the partition may not even be ours any more).
                self._rewind_later(f"seeking back in {topic}[{partition}]", exc.args[0])
                return []
        return kept

    def _data_only(self, messages: list[Message]) -> list[Message]:
        data = []
        for message in messages:
            error = message.error()
            if error is None:
                data.append(message)
            else:
                self._client_error(error)
        return data

    def _process(self, messages: list[Message]) -> None:
        inputs = []
        for message in messages:
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

    def _keep_backlogged_alive(self, now: int) -> None:
        """A partition with input waiting on the broker is behind, not idle: without this
        a backlog (or a slow fetch) would close windows early and turn its rows late."""
        behind = self._backlog.behind(self._pipeline.assigned())
        self._pipeline.keep_alive(behind, now)

    def _flush(self, now: int | None = None, *, force: bool = False) -> None:
        now = self._clock() if now is None else now
        flush = self._pipeline.flush(now, force=force)
        self._pause_and_resume(flush.pause, flush.resume)
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

    def _pause_and_resume(self, pause: list[PartitionKey], resume: list[PartitionKey]) -> None:
        try:
            if pause:
                self._consumer.pause(_topic_partitions(pause))
                self._paused.update(pause)
            if resume:
                self._consumer.resume(_topic_partitions(resume))
                self._paused.difference_update(resume)
        except KafkaException as exc:
            # The budget's pauses and the client's would disagree: a rewind releases
            # every pause and builds the state (and the pauses it needs) anew.
            self._rewind_later("pausing or resuming partitions", exc.args[0])

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

    def _rewind_later(self, doing: str, error: KafkaError) -> None:
        """Answer a client error by replaying from the committed offsets, next turn."""
        stop_if_fatal(error, "input consumer")
        log.warning("%s failed (%s): replaying from the committed offsets", doing, error.str())
        self._rewind_needed = True

    def _rewind(self) -> None:
        """Throw away window state; replay every assigned partition from its commit.

        Any client error on the way leaves the rewind to do again on the next turn, on
        the assignment as it is then: what the polls in between return is dropped."""
        try:
            self._rewind_now()
        except KafkaException as exc:
            self._rewind_attempts.failed(exc.args[0])
            return
        self._rewind_attempts.succeeded()
        self._rewind_needed = False

    def _rewind_now(self) -> None:
        assignment = self._consumer.assignment()
        committed = (self._consumer.committed(assignment, timeout=COMMITTED_TIMEOUT_S)
                     if assignment else [])
        points = {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None,
                                             CommitMetadata.decode(tp.metadata))
                  for tp in committed}
        targets, released = self._pipeline.restart(points, self._clock())
        # The state they were paused for is gone; so is any pause the budget and the
        # client disagreed on (a pause or resume that failed).
        paused = sorted(self._paused.union(released))
        if paused:
            self._consumer.resume(_topic_partitions(paused))
            self._paused.clear()
        for (topic, partition), offset in targets.items():
            target = OFFSET_BEGINNING if offset is None else offset
            self._consumer.seek(TopicPartition(topic, partition, target))
        log.info("rewound %d partitions to their committed offsets", len(targets))

    def _client_error(self, error: KafkaError) -> None:
        """An error the client reported on its own (not a call's answer): stop on a fatal
        one; the others (a broker going away, a retriable fetch error) the client
        retries by itself."""
        stop_if_fatal(error, "input consumer")
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
