"""librdkafka configurations for the daemon's consumer, producer and admin client.

Our settings come first; the raw keys in ``kafka.consumer`` / ``kafka.producer`` are
applied last, untouched, so an operator can override anything.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from consumer.config import KafkaSettings, ProcessingSettings

log = logging.getLogger(__name__)


class KafkaSetupError(Exception):
    """The broker is unreachable or a topic is missing; one line for the user."""


def _common(kafka: KafkaSettings) -> dict[str, Any]:
    return {
        "bootstrap.servers": kafka.bootstrap_servers,
        "client.id": kafka.client_id,
        "logger": logging.getLogger("librdkafka"),
    }


def instance_id(processing: ProcessingSettings) -> str:
    return processing.instance_id or socket.gethostname()


def consumer_config(kafka: KafkaSettings, processing: ProcessingSettings) -> dict[str, Any]:
    isolation = "read_committed" if processing.guarantee == "exactly_once" else "read_uncommitted"
    return {
        **_common(kafka),
        "group.id": kafka.group_id,
        "group.instance.id": instance_id(processing),
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "isolation.level": isolation,
        "partition.assignment.strategy": "cooperative-sticky",
        # Fewer, larger fetches: the daemon works on batches of messages.
        "fetch.min.bytes": 1,
        "fetch.wait.max.ms": 100,
        "max.partition.fetch.bytes": 16 * 1024 * 1024,
        "enable.partition.eof": False,
        **kafka.consumer,
    }


def producer_config(kafka: KafkaSettings, processing: ProcessingSettings) -> dict[str, Any]:
    config: dict[str, Any] = {
        **_common(kafka),
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "compression.type": "none",  # output values are Arrow-compressed already
    }
    if processing.guarantee == "exactly_once":
        config["transactional.id"] = f"{kafka.group_id}-{instance_id(processing)}"
        config["transaction.timeout.ms"] = 60_000
    return {**config, **kafka.producer}


def check_topics(kafka: KafkaSettings, topics: list[str], *, timeout_s: float = 5.0) -> None:
    """Fail fast, with one line, when the broker does not answer or a topic is missing."""
    admin = AdminClient({**_common(kafka), **_admin_keys(kafka)})
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise KafkaSetupError(
            f"cannot reach Kafka at {kafka.bootstrap_servers} within {timeout_s:.0f}s "
            f"({exc.args[0].str()}); check kafka.bootstrap_servers or KAFKA_BOOTSTRAP_SERVERS"
        ) from exc
    missing = [t for t in topics if t not in metadata.topics]
    if missing:
        raise KafkaSetupError(
            f"topic(s) {', '.join(missing)} do not exist on {kafka.bootstrap_servers}; "
            "create them (the daemon does not create topics)")


def _admin_keys(kafka: KafkaSettings) -> dict[str, Any]:
    # Security settings apply to every client; consumer-only keys would be rejected.
    return {k: v for k, v in kafka.consumer.items()
            if k.startswith(("security.", "sasl.", "ssl."))}
