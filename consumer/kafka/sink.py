"""Where results go, and how they are committed with the input offsets they depend on.

``TransactionalSink`` (exactly-once): every flush is one Kafka transaction holding the
output records (windows, late rows, dead letters) and the input offsets, so a reader with
``isolation.level=read_committed`` sees a window exactly when its input is committed.

``AtLeastOnceSink``: records are produced and flushed, then the offsets are committed;
a crash between the two repeats the records, never loses them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from consumer.core.types import OutputRecord
from consumer.kafka.clients import InputConsumer
from wire.errors import ArrowaggError

log = logging.getLogger(__name__)


class AbortRequiredError(ArrowaggError):
    """A control signal, not a failure: the transaction was aborted, so the run loop
    rewinds to the committed offsets and rebuilds its state."""


class FatalKafkaError(ArrowaggError):
    """The producer cannot go on (fenced by a newer instance, or a fatal client error)."""

    headline: ClassVar[str] = "stopping on a fatal Kafka error: "


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


def _produce_all(producer: Producer, records: Sequence[OutputRecord],
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
    def __init__(self, config: dict[str, Any], *, init_timeout_s: float = 30.0) -> None:
        self._config = config
        self._init_timeout_s = init_timeout_s
        self._producer = self._new_producer()
        self._failed: KafkaError | None = None  # the fatal error, once there is one

    def _new_producer(self) -> Producer:
        producer = Producer(self._config)
        _call(lambda: producer.init_transactions(self._init_timeout_s))
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
        if error.txn_requires_abort():
            log.warning("transaction aborted: %s", error.str())
            self._abort()
            raise AbortRequiredError(error.str()) from exc
        if error.code() == KafkaError._TIMED_OUT:
            # A timed-out commit leaves the outcome unknown; a new producer (same id)
            # fences the old session and aborts whatever it left open.
            log.warning("transaction commit timed out; re-creating the producer")
            self._producer = self._new_producer()
            raise AbortRequiredError(error.str()) from exc
        self._failed = error
        raise FatalKafkaError(_described(error)) from exc

    def _abort(self) -> None:
        try:
            self._producer.abort_transaction(30)
        except KafkaException as exc:
            self._failed = exc.args[0]
            raise FatalKafkaError(f"abort failed: {exc.args[0].str()}") from exc

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
    def __init__(self, config: dict[str, Any]) -> None:
        self._producer = Producer(config)

    def flush(self, records: Sequence[OutputRecord], offsets: Sequence[TopicPartition],
              consumer: InputConsumer) -> None:
        tracker = _DeliveryTracker()
        _produce_all(self._producer, records, tracker)
        remaining = self._producer.flush(60)
        if remaining or tracker.errors:
            detail = tracker.errors[0].str() if tracker.errors else f"{remaining} undelivered"
            raise AbortRequiredError(f"output delivery failed: {detail}")
        if offsets:
            try:
                consumer.commit(offsets=list(offsets), asynchronous=False)
            except KafkaException as exc:
                raise AbortRequiredError(f"offset commit failed: {exc.args[0].str()}") from exc

    def close(self) -> None:
        _close(self._producer)


# What the broker and librdkafka say, in some order, when a newer producer with our
# transactional.id has taken over (a restarted instance, or a second one with the same id).
_FENCED = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                     KafkaError.INVALID_PRODUCER_EPOCH})


def _described(error: KafkaError) -> str:
    """The error's text, saying plainly when it means we were fenced."""
    fenced = error.code() in _FENCED or "old epoch" in error.str()
    if fenced and "fenced" not in error.str():
        return f"fenced by a newer instance with the same transactional.id ({error.str()})"
    return error.str()


def _close(producer: Producer) -> None:
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
