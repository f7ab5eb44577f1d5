"""An in-memory broker for unit tests of the run loop (after Sentry Arroyo's LocalBroker).

``FakeBroker`` holds topics as lists of ``confluent_kafka.Message`` per partition and a
consumer group's committed offsets (with their metadata). ``FakeConsumer`` implements
the ``InputConsumer`` protocol the run loop uses: rebalance events queued by the test are
served from inside ``poll``/``consume``, as librdkafka serves its callbacks, and each
partition is read from its committed offset on. ``FakeSink`` commits a flush's records
and offsets atomically, like a transaction, or raises whatever the test queued for it;
``FakeProducer`` is the transactional producer under the daemon's real sinks.

Both clients raise librdkafka's own errors (``KafkaException(KafkaError(code))``) from
any call a test names in ``fail``, as the real clients do when a rebalance, a lost
assignment, a fence or a failover meets the call; a seek on a partition that is not
assigned answers ``_STATE``, as librdkafka's does. ``committed`` can also wait, as
librdkafka's does while a transaction holds offsets of the partitions (read_committed)
or no coordinator answers: on the test's clock, for its whole timeout, then ``_TIMED_OUT``.

This is not a Kafka: no replication, no fencing of its own, no isolation levels. The
real broker's behaviour is tested in tests/integration; this one makes the loop's
assign / revoke / lost / abort / rewind / fenced paths fast and exact to test.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, TopicPartition

from consumer.core.types import OutputRecord, PartitionKey
from consumer.kafka.clients import RebalanceCallback

OFFSET_INVALID = -1001  # what librdkafka reports for "no offset"


@dataclass
class FakeBroker:
    topics: dict[str, list[list[Message]]] = field(default_factory=dict)
    committed: dict[PartitionKey, TopicPartition] = field(default_factory=dict)
    transactions: list[tuple[list[OutputRecord], list[TopicPartition]]] = field(
        default_factory=list)

    def create_topic(self, name: str, partitions: int = 1) -> None:
        self.topics[name] = [[] for _ in range(partitions)]

    def produce(self, topic: str, partition: int, value: bytes | None, *,
                key: bytes | None = None,
                headers: Sequence[tuple[str, str | bytes | None]] | None = None,
                timestamp_ms: int = 0) -> int:
        log = self.topics[topic][partition]
        log.append(Message(topic=topic, partition=partition, offset=len(log), key=key,
                           value=value, headers=list(headers) if headers else None,
                           timestamp=(1, timestamp_ms)))
        return len(log) - 1

    def commit(self, offsets: Sequence[TopicPartition]) -> None:
        for tp in offsets:
            self.committed[(tp.topic, tp.partition)] = TopicPartition(
                tp.topic, tp.partition, tp.offset, metadata=tp.metadata)

    def commit_transaction(self, records: Sequence[OutputRecord],
                           offsets: Sequence[TopicPartition]) -> None:
        """Records and offsets at once; the records readable by the consumers of the
        topics they exist in."""
        self.transactions.append((list(records), list(offsets)))
        self.commit(offsets)
        for record in records:
            if record.topic in self.topics:
                logs = self.topics[record.topic]
                partition = (record.partition if record.partition is not None
                             else zlib.crc32(record.key or b"") % len(logs))
                self.produce(record.topic, partition, record.value, key=record.key,
                             headers=record.headers)

    def committed_offset(self, topic: str, partition: int) -> int | None:
        tp = self.committed.get((topic, partition))
        return None if tp is None else tp.offset

    def output(self, topic: str) -> list[OutputRecord]:
        """Every record committed to ``topic``, in commit order."""
        return [r for records, _ in self.transactions for r in records if r.topic == topic]


class FailingCalls:
    """Errors to raise from named client calls, each once, in the order given."""

    def __init__(self) -> None:
        self._queued: dict[str, list[KafkaError]] = {}
        self.raised: list[tuple[str, int]] = []  # (call, error code), as they happened

    def fail(self, call: str, error: KafkaError | int, *, times: int = 1) -> None:
        """The next ``times`` calls of ``call`` raise ``error`` (a code: its KafkaError)."""
        if isinstance(error, int):
            error = KafkaError(error)
        self._queued.setdefault(call, []).extend([error] * times)

    def check(self, call: str) -> None:
        queued = self._queued.get(call)
        if queued:
            error = queued.pop(0)
            self.raised.append((call, error.code()))
            raise KafkaException(error)


@dataclass
class _Event:
    kind: Literal["assign", "revoke", "lost"]
    partitions: list[TopicPartition]


class FakeConsumer:
    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker
        self.callbacks: dict[str, RebalanceCallback | None] = {}
        self.events: list[_Event] = []
        # Errors the client raises on its own (librdkafka's error events: a fatal fence,
        # a broker gone): delivered once, first in the next poll/consume, not in a log.
        self.error_events: list[KafkaError] = []
        self.positions: dict[PartitionKey, int] = {}
        self.paused: set[PartitionKey] = set()
        self.seeks: list[tuple[PartitionKey, int]] = []
        self.closed = False
        self.callback_errors: list[BaseException] = []
        # Set to deliver messages of paused partitions anyway, as librdkafka may for
        # messages it had queued before the pause took effect.
        self.leak_paused = False
        self.failures = FailingCalls()
        # Until this time on ``clock`` (the rig's: an object with ``now_ms``), the
        # committed offsets are unstable: ``committed`` waits, moving the clock.
        self.offsets_unstable_until_ms: int | None = None
        self.clock: Any = None
        self.polled_at: list[int] = []  # on ``clock``, when it is set
        # While set (``stop_fetching``), the client's fetcher has not run, as in a process
        # stopped or starved: nothing is delivered, and the cached high watermarks are
        # those of when it stopped. ``broker_queries``: the uncached lookups made.
        self.fetched_ends: dict[PartitionKey, int] | None = None
        self.broker_queries: list[PartitionKey] = []

    def fail(self, call: str, error: KafkaError | int, *, times: int = 1) -> None:
        self.failures.fail(call, error, times=times)

    # -- test controls -----------------------------------------------------------------

    def rebalance(self, kind: Literal["assign", "revoke", "lost"],
                  partitions: Sequence[PartitionKey]) -> None:
        """Queue a rebalance event; it is served inside the next poll/consume."""
        self.events.append(_Event(kind, [TopicPartition(t, p) for t, p in partitions]))

    def stop_fetching(self) -> None:
        self.fetched_ends = {key: len(self.broker.topics[key[0]][key[1]])
                             for key in self.positions}

    def resume_fetching(self) -> None:
        self.fetched_ends = None

    # -- InputConsumer -----------------------------------------------------------------

    def subscribe(self, topics: list[str], on_assign: RebalanceCallback | None = None,
                  on_revoke: RebalanceCallback | None = None,
                  on_lost: RebalanceCallback | None = None) -> None:
        del topics  # the test says which partitions are assigned
        self.failures.check("subscribe")
        self.callbacks = {"assign": on_assign, "revoke": on_revoke, "lost": on_lost}

    def poll(self, timeout: float = -1) -> Message | None:
        del timeout
        self.failures.check("poll")
        messages = self._take(1)
        return messages[0] if messages else None

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        del timeout  # nothing ever arrives while waiting: the test publishes up front
        self.failures.check("consume")
        return self._take(num_messages)

    def _take(self, num_messages: int) -> list[Message]:
        if self.clock is not None:
            self.polled_at.append(self.clock.now_ms)
        self._serve_events()
        out: list[Message] = [Message(error=error) for error in self.error_events]
        self.error_events.clear()
        if self.fetched_ends is not None:
            return out
        for key in sorted(self.positions):
            if key in self.paused and not self.leak_paused:
                continue
            log = self.broker.topics[key[0]][key[1]]
            while len(out) < num_messages and self.positions[key] < len(log):
                out.append(log[self.positions[key]])
                self.positions[key] += 1
        return out

    def _serve_events(self) -> None:
        while self.events:
            event = self.events.pop(0)
            callback = self.callbacks.get(event.kind)
            if event.kind == "assign":
                for tp in event.partitions:
                    start = self.broker.committed_offset(tp.topic, tp.partition)
                    self.positions[(tp.topic, tp.partition)] = start or 0
            if callback is not None:
                try:
                    callback(self, event.partitions)
                except BaseException as err:
                    # librdkafka holds an exception raised in a callback pending in C,
                    # where it breaks later client calls: callbacks must not raise.
                    self.callback_errors.append(err)
                    raise
            if event.kind != "assign":
                for tp in event.partitions:
                    self.positions.pop((tp.topic, tp.partition), None)
                    self.paused.discard((tp.topic, tp.partition))

    def assignment(self) -> list[TopicPartition]:
        self.failures.check("assignment")
        return [TopicPartition(t, p) for t, p in sorted(self.positions)]

    def committed(self, partitions: list[TopicPartition],
                  timeout: float = -1) -> list[TopicPartition]:
        self.failures.check("committed")
        self._wait_until_stable(timeout)
        out = []
        for tp in partitions:
            stored = self.broker.committed.get((tp.topic, tp.partition))
            out.append(stored if stored is not None
                       else TopicPartition(tp.topic, tp.partition, OFFSET_INVALID))
        return out

    def _wait_until_stable(self, timeout_s: float) -> None:
        until = self.offsets_unstable_until_ms
        if until is None or self.clock is None or self.clock.now_ms >= until:
            return
        if timeout_s >= 0 and self.clock.now_ms + timeout_s * 1000 < until:
            self.clock.now_ms += int(timeout_s * 1000)
            self.failures.raised.append(("committed", KafkaError._TIMED_OUT))
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        self.clock.now_ms = until

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        self.failures.check("position")
        return [TopicPartition(tp.topic, tp.partition,
                               self.positions.get((tp.topic, tp.partition), OFFSET_INVALID))
                for tp in partitions]

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float = -1,
                              cached: bool = False) -> tuple[int, int]:
        del timeout
        # Two calls in librdkafka (rd_kafka_get_ / rd_kafka_query_watermark_offsets),
        # each failing on its own.
        self.failures.check("get_watermark_offsets" if cached else "query_watermark_offsets")
        key = (partition.topic, partition.partition)
        if key not in self.positions:
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))
        if not cached:
            self.broker_queries.append(key)
        elif self.fetched_ends is not None and key in self.fetched_ends:
            return 0, self.fetched_ends[key]
        return 0, len(self.broker.topics[partition.topic][partition.partition])

    def seek(self, partition: TopicPartition) -> None:
        self.failures.check("seek")
        if (partition.topic, partition.partition) not in self.positions:
            raise KafkaException(KafkaError(KafkaError._STATE))
        offset = 0 if partition.offset == OFFSET_BEGINNING else partition.offset
        self.positions[(partition.topic, partition.partition)] = offset
        self.seeks.append(((partition.topic, partition.partition), offset))

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.failures.check("pause")
        self.paused.update((tp.topic, tp.partition) for tp in partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.failures.check("resume")
        self.paused.difference_update((tp.topic, tp.partition) for tp in partitions)

    def commit(self, *, offsets: list[TopicPartition],
               asynchronous: Literal[False]) -> list[TopicPartition]:
        del asynchronous
        self.failures.check("commit")
        self.broker.commit(offsets)
        return offsets

    def consumer_group_metadata(self) -> Any:
        return object()

    def close(self) -> None:
        self.closed = True
        self.failures.check("close")


class FakeSink:
    """Commits records and offsets together; raises the errors queued in ``failures``
    (one per flush, in order) instead of committing."""

    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker
        self.failures: list[BaseException] = []
        self.flushes = 0
        self.closed = False

    def flush(self, records: Sequence[OutputRecord], offsets: Sequence[TopicPartition],
              consumer: Any) -> None:
        del consumer
        self.flushes += 1
        if self.failures:
            raise self.failures.pop(0)
        self.broker.commit_transaction(records, offsets)

    def close(self) -> None:
        self.closed = True


class FakeProducer:
    """A transactional producer: what a transaction produced and the offsets sent to it
    reach the broker at ``commit_transaction``, all at once, or never."""

    def __init__(self, broker: FakeBroker, failures: FailingCalls | None = None) -> None:
        self.broker = broker
        self.failures = failures or FailingCalls()
        self._records: list[OutputRecord] = []
        self._offsets: list[TopicPartition] = []
        self.calls: list[str] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        self.failures.check(name)

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                *args: Any, **kwargs: Any) -> None:
        del args
        self._call("produce")
        headers = tuple(kwargs.get("headers") or ())
        self._records.append(OutputRecord(topic, key, value, headers,
                                          kwargs.get("partition")))

    def poll(self, timeout: float = -1) -> int:
        del timeout
        return 0

    def flush(self, timeout: float = -1) -> int:
        del timeout
        self._call("flush")
        if self._records:  # without a transaction (at least once), produced is delivered
            self.broker.commit_transaction(self._records, [])
            self._records = []
        return 0

    def init_transactions(self, timeout: float = -1) -> None:
        del timeout
        self._call("init_transactions")

    def begin_transaction(self) -> None:
        self._call("begin_transaction")
        self._records, self._offsets = [], []

    def send_offsets_to_transaction(self, positions: list[TopicPartition], group_metadata: Any,
                                    timeout: float = -1) -> None:
        del group_metadata, timeout
        self._call("send_offsets_to_transaction")
        self._offsets = list(positions)

    def commit_transaction(self, timeout: float = -1) -> None:
        del timeout
        self._call("commit_transaction")
        self.broker.commit_transaction(self._records, self._offsets)
        self._records, self._offsets = [], []

    def abort_transaction(self, timeout: float = -1) -> None:
        del timeout
        self._call("abort_transaction")
        self._records, self._offsets = [], []
