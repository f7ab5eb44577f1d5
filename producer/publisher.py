"""Publish Arrow and Polars data to an input topic in the wire format of ``wire.input``.

A thin adapter over ``confluent_kafka.Producer``: encoding and splitting live in
``wire.input``; this module adds the Kafka habits (idempotence, ``poll(0)`` after each
produce, retry on a full local queue, delivery accounting, flush on close).
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

import polars as pl
import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin._metadata import ClusterMetadata  # admin re-exports it untyped

from wire.broker import nothing_listens
from wire.errors import ArrowaggError
from wire.files import InputFile
from wire.input import (
    Compression,
    dictionary_keys,
    encode_for_size,
    message_headers,
    schema_fingerprint,
)

log = logging.getLogger(__name__)

# Room for the record's key, headers and Kafka's record/batch framing, which count
# against the broker's max.message.bytes but not against the encoded stream.
FRAMING_BYTES: Final = 1024
_LINGER_MS: Final = 5
_QUEUE_FULL_POLL_S: Final = 0.1
_BROKER_PREFIX: Final = re.compile(r"^\S+/\S+: ")


class PublishError(ArrowaggError):
    """Publishing failed or could not start; ``str()`` is one line saying what and how to mend."""


class BrokerUnreachableError(PublishError):
    """No broker answered at the bootstrap servers in time."""


class Publisher:
    """Sends tables as arrowagg input messages on one topic, as one producer identity.

    Each message carries the schema fingerprint, this publisher's ``producer_id`` and a
    sequence number that starts at 0 and grows by one per message, so a consumer can
    tell duplicates and gaps. A table too big for one message is split by rows, and the
    pieces carry ``arrowagg.chunk`` headers. Use as a context manager, or call
    ``close()``: delivery is only certain after ``flush()`` returns.
    """

    def __init__(
        self,
        *,
        bootstrap_servers: str,
        topic: str,
        producer_id: str | None = None,
        compression: Compression = "none",
        max_message_bytes: int = 1_000_000,
        dictionary_strings: bool = True,
        extra_config: Mapping[str, str | int | bool] | None = None,
    ) -> None:
        if max_message_bytes <= FRAMING_BYTES:
            raise ValueError(f"max_message_bytes must exceed {FRAMING_BYTES}")
        self.topic = topic
        self.producer_id = producer_id or uuid.uuid4().hex
        self.compression: Compression = compression
        self.max_message_bytes = max_message_bytes
        # String columns go out dictionary-encoded (wire.input.dictionary_keys): the
        # messages are smaller and the daemon groups on the codes instead of hashing
        # strings (docs/benchmark-findings.md). Any Arrow reader decodes them to the same values.
        self.dictionary_strings = dictionary_strings
        self._bootstrap_servers = bootstrap_servers
        self._next_sequence = 0
        self.sent = self.delivered = self.failed = self.bytes_sent = 0
        self._first_failure: str | None = None
        self._last_client_error: str | None = None
        self._closed = False
        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap_servers,
            "client.id": f"arrowagg-producer-{self.producer_id}",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": _LINGER_MS,
            # librdkafka packs several messages into one record batch, and the broker
            # holds the whole batch to the topic's max.message.bytes.
            "batch.size": max_message_bytes,
            # The client-side cap only needs raising, never lowering below its default.
            "message.max.bytes": max(max_message_bytes, 1_000_000),
            "logger": log,
            "error_cb": self._on_client_error,
            **(extra_config or {}),
        }
        self._producer = Producer(config)

    def check_topic(self, timeout_s: float = 10.0) -> int:
        """Fail fast, within ``timeout_s``, unless the broker answers and the topic exists.

        Returns the topic's partition count. Asks for all topics' metadata rather than this
        one's, because asking for one topic may auto-create it on brokers that allow that.
        """
        if (refused := nothing_listens(self._bootstrap_servers)) is not None:
            raise BrokerUnreachableError(  # at once: librdkafka would retry until timeout_s
                f"cannot reach Kafka at {self._bootstrap_servers} ({refused}); start a "
                "broker there or name another")
        try:
            metadata: ClusterMetadata = self._producer.list_topics(timeout=timeout_s)
        except KafkaException as exc:
            self._producer.poll(0)  # collect the client's own account of the failure
            why = self._last_client_error or _kafka_error_text(exc)
            raise BrokerUnreachableError(
                f"cannot reach Kafka at {self._bootstrap_servers} ({why}); "
                "start a broker there or name another"
            ) from None
        topic = metadata.topics.get(self.topic)
        if topic is None:
            raise PublishError(
                f"topic {self.topic!r} does not exist on {self._bootstrap_servers}; "
                "create it first or check the topic name"
            )
        if topic.error is not None:
            raise PublishError(f"topic {self.topic!r} is not usable: {topic.error.str()}")
        return len(topic.partitions)

    def publish(
        self, data: pa.Table | pa.RecordBatch | pl.DataFrame, *, key: bytes | None = None
    ) -> int:
        """Queue ``data`` as one or more messages; returns how many. Empty data sends none."""
        fingerprint, payloads = self.encode(data, key=key)
        for index, payload in enumerate(payloads, start=1):
            headers = message_headers(
                fingerprint=fingerprint,
                producer_id=self.producer_id,
                sequence=self._next_sequence,
                chunk=(index, len(payloads)) if len(payloads) > 1 else None,
            )
            self._produce(payload, key, headers)
            self._next_sequence += 1
        return len(payloads)

    def encode(self, data: pa.Table | pa.RecordBatch | pl.DataFrame, *,
               key: bytes | None = None) -> tuple[str, list[bytes]]:
        """The schema fingerprint and message values ``publish`` would send for ``data``."""
        table = _as_table(data)
        if self.dictionary_strings:
            table = dictionary_keys(table)
        max_bytes = self.max_message_bytes - FRAMING_BYTES - len(key or b"")
        payloads = encode_for_size(table, max_bytes=max_bytes, compression=self.compression)
        return schema_fingerprint(table.schema), payloads

    def publish_ipc_file(self, path: str | Path, *, key: bytes | None = None) -> int:
        """Publish an Arrow IPC stream, Arrow IPC file or Parquet file, batch by batch.

        Returns the number of messages. Raises ``wire.files.UnreadableFileError`` for a
        file that is missing or not one of those formats.
        """
        return sum(self.publish(batch, key=key) for batch in InputFile.open(path).batches())

    def poll(self, timeout_s: float = 0.0) -> None:
        """Serve delivery reports, waiting up to ``timeout_s``; a way to idle between sends."""
        self._producer.poll(timeout_s)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait for every queued message; raise PublishError if any failed or is still queued."""
        undelivered = self._producer.flush(timeout_s)
        if self.failed:
            raise PublishError(
                f"{self.failed} of {self.sent} messages to {self.topic!r} failed "
                f"(first: {self._first_failure})"
            )
        if undelivered:
            raise PublishError(
                f"{undelivered} of {self.sent} messages to {self.topic!r} still undelivered "
                f"after {timeout_s:g}s; is the broker reachable?"
            )

    def drain(self, timeout_s: float = 5.0) -> int:
        """Wait up to ``timeout_s`` for queued messages, raising nothing; how many are
        still queued. For accounting after a failure (``delivered``, ``failed``)."""
        return int(self._producer.flush(timeout_s))

    def close(self, timeout_s: float = 30.0) -> None:
        """Flush (raising as ``flush`` does), then release the client; once is enough."""
        if self._closed:
            return
        self._closed = True
        try:
            self.flush(timeout_s)
        finally:
            self._producer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
            return
        if not self._closed:
            # Already failing: deliver what we can, but let the original error through.
            self._closed = True
            self._producer.flush(5.0)
            self._producer.close()

    def _produce(self, payload: bytes, key: bytes | None, headers: list[tuple[str, bytes]]) -> None:
        while True:
            try:
                self._producer.produce(self.topic, payload, key=key, headers=list(headers),
                                       on_delivery=self._on_delivery)
                break
            except BufferError:
                self._producer.poll(_QUEUE_FULL_POLL_S)  # local queue full: let deliveries drain
            except KafkaException as exc:
                raise PublishError(
                    f"cannot queue a message for {self.topic!r}: {_kafka_error_text(exc)}"
                ) from None
        self.sent += 1
        self.bytes_sent += len(payload)
        self._producer.poll(0)

    def _on_delivery(self, error: KafkaError | None, _message: Message[Any, Any]) -> None:
        if error is None:
            self.delivered += 1
            return
        self.failed += 1
        if self._first_failure is None:
            self._first_failure = error.str()
            if error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                self._first_failure += (
                    f"; the topic takes less than {self.max_message_bytes} bytes a message: "
                    "lower max_message_bytes to its max.message.bytes"
                )

    def _on_client_error(self, error: KafkaError) -> None:
        # Drop librdkafka's "host:port/id: " prefix; the message names the servers already.
        self._last_client_error = _BROKER_PREFIX.sub("", error.str())
        log.debug("kafka client error: %s", error.str())


def _as_table(data: pa.Table | pa.RecordBatch | pl.DataFrame) -> pa.Table:
    if isinstance(data, pl.DataFrame):
        return data.to_arrow()
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    return data


def _kafka_error_text(exc: KafkaException) -> str:
    error = exc.args[0] if exc.args else None
    return error.str() if isinstance(error, KafkaError) else str(exc)
