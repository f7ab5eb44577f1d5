"""Where results go, and how they are committed with the input offsets they depend on.

``TransactionalSink`` (exactly-once): every flush is one Kafka transaction holding the
output records (windows, late rows, dead letters) and the input offsets, so a reader with
``isolation.level=read_committed`` sees a window exactly when its input is committed.

``AtLeastOnceSink``: records are produced and flushed, then the offsets are committed;
a crash between the two repeats the records, never loses them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from consumer.core.types import OutputRecord
from consumer.kafka.clients import InputConsumer
from consumer.kafka.errors import FatalKafkaError, described, is_fatal, is_fenced
from wire.errors import ArrowaggError

log = logging.getLogger(__name__)


class AbortRequiredError(ArrowaggError):
    """A control signal, not a failure: the transaction was aborted, so the run loop
    rewinds to the committed offsets and rebuilds its state."""


class OutputProducer(Protocol):
    """The part of confluent_kafka's Producer the sinks use; an in-memory fake
    (tests/consumer/kafka/fake_broker.py) implements it too, raising librdkafka's errors
    where a test asks it to."""

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                *args: Any, **kwargs: Any) -> None: ...
    def poll(self, timeout: float = -1) -> int: ...
    def flush(self, timeout: float = -1) -> int: ...
    def init_transactions(self, timeout: float = -1) -> None: ...
    def begin_transaction(self) -> None: ...
    def send_offsets_to_transaction(self, positions: list[TopicPartition], group_metadata: Any,
                                    timeout: float = -1) -> None: ...
    def commit_transaction(self, timeout: float = -1) -> None: ...
    def abort_transaction(self, timeout: float = -1) -> None: ...


ProducerFactory = Callable[[dict[str, Any]], OutputProducer]


class OutputSink(Protocol):
    def flush(self, records: Sequence[OutputRecord], offsets: Sequence[TopicPartition],
              consumer: InputConsumer) -> None: ...
    def close(self) -> None: ...


class _DeliveryTracker:
    def __init__(self) -> None:
        self.errors: list[KafkaError] = []

    def __call__(self, err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            self.errors.append(err)


def _produce_all(producer: OutputProducer, records: Sequence[OutputRecord],
                 tracker: _DeliveryTracker) -> None:
    for record in records:
        while True:
            try:
                if record.partition is None:
                    producer.produce(record.topic, record.value, record.key,
                                     headers=list(record.headers), on_delivery=tracker)
                else:
                    producer.produce(record.topic, record.value, record.key,
                                     partition=record.partition,
                                     headers=list(record.headers), on_delivery=tracker)
                break
            except BufferError:
                producer.poll(0.1)  # the local queue is full: let deliveries drain
        producer.poll(0)


class TransactionalSink:
    """Each flush one transaction. A client error is answered by its kind
    (consumer/kafka/errors.py): fatal -> stop; abortable -> abort, then replay; anything
    else (a timed-out commit, a state the producer should not be in) -> a new producer with
    the same transactional.id, which fences this one's session and aborts whatever it left
    open, then replay."""

    def __init__(self, config: dict[str, Any], *, init_timeout_s: float = 30.0,
                 new_producer: ProducerFactory = Producer) -> None:
        self._config = config
        self._init_timeout_s = init_timeout_s
        self._new_producer = new_producer
        self._failed: KafkaError | None = None  # the fatal error, once there is one
        self._producer = self._started_producer()

    def _started_producer(self) -> OutputProducer:
        producer = self._new_producer(self._config)
        try:
            _call(lambda: producer.init_transactions(self._init_timeout_s))
        except KafkaException as exc:
            self._failed = exc.args[0]
            raise FatalKafkaError(
                f"cannot start a transactional producer: {described(exc.args[0])}") from exc
        return producer

    def flush(self, records: Sequence[OutputRecord], offsets: Sequence[TopicPartition],
              consumer: InputConsumer) -> None:
        tracker = _DeliveryTracker()
        try:
            self._producer.begin_transaction()
            _produce_all(self._producer, records, tracker)
            if offsets:
                _call(lambda: self._producer.send_offsets_to_transaction(
                    list(offsets), consumer.consumer_group_metadata(), 30))
            _call(lambda: self._producer.commit_transaction(60))
        except KafkaException as exc:
            self._handle(exc)
        if tracker.errors:  # commit_transaction fails first on delivery errors; be sure
            raise AbortRequiredError(f"output delivery failed: {tracker.errors[0]}")

    def _handle(self, exc: KafkaException) -> None:
        error: KafkaError = exc.args[0]
        if error.fatal():
            self._failed = error
            raise FatalKafkaError(described(error)) from exc
        if error.txn_requires_abort():
            # Abortable first: librdkafka flags a stale group generation so (a
            # FENCED_INSTANCE_ID on the offsets, after our own consumer rejoined the group
            # with a new member id, say): a replay with the new generation mends it.
            log.warning("transaction aborted: %s", error.str())
            self._abort()
        elif is_fatal(error) or is_fenced(error):
            self._failed = error
            raise FatalKafkaError(described(error)) from exc
        else:
            # A timed-out commit leaves the outcome unknown, and an error in another
            # state leaves the producer's state unknown: start a session afresh.
            log.warning("transaction failed (%s); re-creating the producer", error.str())
            self._producer = self._started_producer()
        raise AbortRequiredError(error.str()) from exc

    def _abort(self) -> None:
        try:
            _call(lambda: self._producer.abort_transaction(30))
        except KafkaException as exc:
            if is_fatal(exc.args[0]) or is_fenced(exc.args[0]):
                self._failed = exc.args[0]
                raise FatalKafkaError(f"abort failed: {described(exc.args[0])}") from exc
            log.warning("abort failed (%s); re-creating the producer", exc.args[0].str())
            self._producer = self._started_producer()

    def close(self) -> None:
        if self._failed is not None:
            # A fenced or otherwise failed producer has nothing left to deliver, and
            # flushing it ran its delivery callbacks into a SystemError (seen when the
            # fencing came inside a revoke callback): the error that stopped us is the
            # one to report.
            log.info("producer closed in a failed state: %s", self._failed.str())
            return
        _close(self._producer)


class AtLeastOnceSink:
    def __init__(self, config: dict[str, Any], *,
                 new_producer: ProducerFactory = Producer) -> None:
        self._producer = new_producer(config)

    def flush(self, records: Sequence[OutputRecord], offsets: Sequence[TopicPartition],
              consumer: InputConsumer) -> None:
        tracker = _DeliveryTracker()
        try:
            _produce_all(self._producer, records, tracker)
            remaining = self._producer.flush(60)
        except KafkaException as exc:
            raise _stop_or_replay("output delivery failed", exc.args[0]) from exc
        if remaining or tracker.errors:
            detail = tracker.errors[0].str() if tracker.errors else f"{remaining} undelivered"
            raise AbortRequiredError(f"output delivery failed: {detail}")
        if offsets:
            try:
                consumer.commit(offsets=list(offsets), asynchronous=False)
            except KafkaException as exc:
                # A commit from a generation the group has left (ILLEGAL_GENERATION,
                # REBALANCE_IN_PROGRESS, ...) is refused: replay from what is committed.
                raise _stop_or_replay("offset commit failed", exc.args[0]) from exc

    def close(self) -> None:
        _close(self._producer)


def _stop_or_replay(what: str, error: KafkaError) -> ArrowaggError:
    if is_fatal(error):
        return FatalKafkaError(f"{what}: {described(error)}")
    return AbortRequiredError(f"{what}: {error.str()}")


def _close(producer: OutputProducer) -> None:
    """Deliver what is queued; a producer already failed (fenced, say) has nothing left
    to deliver, and the error that stopped the daemon is the one to report."""
    try:
        producer.flush(10)
    except KafkaException as exc:
        log.info("producer closed in a failed state: %s", exc.args[0].str())


def _call(operation: Any, attempts: int = 5) -> None:
    """Run a client call, retrying while the client says the error is retriable."""
    for attempt in range(attempts):
        try:
            operation()
        except KafkaException as exc:
            if exc.args[0].retriable() and attempt < attempts - 1:
                log.info("retrying after a retriable error: %s", exc.args[0].str())
                continue
            raise
        return
