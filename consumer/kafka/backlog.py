"""Which assigned partitions have input waiting on the broker (the run loop asks every
turn, consumer/kafka/processor.py): such a partition is behind, not idle, so its open
windows stay open for what is still to come instead of closing on the idle timeout."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from confluent_kafka import KafkaException, TopicPartition

from consumer.core.types import PartitionKey
from consumer.kafka.clients import InputConsumer
from consumer.kafka.errors import stop_if_fatal

log = logging.getLogger(__name__)

# The client refreshes a partition's cached high watermark with every fetch response,
# at least every fetch.wait.max.ms (100 ms, consumer/kafka/clients.py), but only while
# the process runs. When more than this passed between two backlog checks beyond the
# poll's own wait (the process stopped, starved, or a turn ran long), the cache may say
# "no backlog" of input that arrived meanwhile; the broker is asked instead.
BACKLOG_CACHE_STALE_MS = 1_000
BROKER_HIGH_WATERMARK_TIMEOUT_S = 1.0


class BacklogCheck:
    """The client's cached high watermarks, unless they may be stale: then a partition
    the cache shows no backlog for is asked of the broker. Without that, a process
    stopped for longer than the idle timeout (SIGSTOP, a starved machine) woke to a cache
    of before the stop and closed its open windows at once, sending the rows that came
    meanwhile late."""

    def __init__(self, consumer: InputConsumer, *, poll_timeout_ms: int,
                 clock: Callable[[], int]) -> None:
        self._consumer = consumer
        self._stale_after_ms = poll_timeout_ms + BACKLOG_CACHE_STALE_MS
        self._clock = clock
        self._checked_ms: int | None = None  # when the last check ended

    def behind(self, assigned: Mapping[PartitionKey, int | None]) -> list[PartitionKey]:
        """The partitions of ``assigned`` (each with its committed offset) with input
        waiting; one the client cannot say about now counts as not behind."""
        started = self._clock()
        stale = (self._checked_ms is not None
                 and started - self._checked_ms > self._stale_after_ms)
        behind = []
        broker_silent = False  # one lookup timed out: the others would wait as long
        for tp in self._positions(assigned) if assigned else []:
            key = (tp.topic, tp.partition)
            try:
                low, high = self._consumer.get_watermark_offsets(tp, cached=True)
            except KafkaException as exc:
                stop_if_fatal(exc.args[0], "input consumer")
                continue  # not known to the client now: no backlog we know of, this turn
            position = tp.offset
            if position < 0:  # nothing consumed from it yet: it starts at its commit
                committed = assigned.get(key)
                position = committed if committed is not None else low
            if high > position:
                behind.append(key)
            elif stale:
                broker_high = None if broker_silent else self._broker_high_watermark(tp)
                broker_silent = broker_high is None
                # A broker that cannot say leaves the partition behind for this turn: its
                # windows wait a turn rather than close early.
                if broker_high is None or broker_high > position:
                    behind.append(key)
        self._checked_ms = self._clock()
        return behind

    def _broker_high_watermark(self, partition: TopicPartition) -> int | None:
        """The partition's end as the broker has it now; None when it does not answer."""
        try:
            _low, high = self._consumer.get_watermark_offsets(
                partition, timeout=BROKER_HIGH_WATERMARK_TIMEOUT_S, cached=False)
        except KafkaException as exc:
            stop_if_fatal(exc.args[0], "input consumer")
            log.info("cannot ask the broker for %s[%d]'s end: %s", partition.topic,
                     partition.partition, exc.args[0].str())
            return None
        return int(high)

    def _positions(self, partitions: Iterable[PartitionKey]) -> list[TopicPartition]:
        """Where the client stands in ``partitions``; those it cannot say (one a
        rebalance took away between two calls) are left out, for this turn."""
        try:
            positions = self._consumer.position(
                [TopicPartition(topic, partition) for topic, partition in partitions])
        except KafkaException as exc:
            stop_if_fatal(exc.args[0], "input consumer")
            log.info("cannot read positions this turn: %s", exc.args[0].str())
            return []
        return [tp for tp in positions if tp.error is None]
