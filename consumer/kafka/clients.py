"""librdkafka configurations for the daemon's consumer, producer and admin client.

Our settings come first (``kafka.security`` goes to every client); the raw keys in
``kafka.consumer`` / ``kafka.producer`` are applied last, untouched, so an operator can
override anything. librdkafka's own log goes to the ``librdkafka`` logger, so it comes out
in the daemon's log format; librdkafka redacts secrets in its configuration dumps.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource  # admin re-exports them untyped
from confluent_kafka.admin._metadata import ClusterMetadata  # admin re-exports it untyped
from confluent_kafka.admin._resource import ResourceType
from confluent_kafka.cimpl import NewTopic

from consumer.config import (
    KafkaSettings,
    ProcessingSettings,
    ScaleOutSettings,
    SecuritySettings,
    Settings,
)
from consumer.kafka.librdkafka_log import librdkafka_logger
from wire.broker import nothing_listens
from wire.errors import ArrowaggError

log = logging.getLogger(__name__)

_BROKER_PREFIX = re.compile(r"^\S+/\S+: ")  # librdkafka's "host:port/id: "


class KafkaSetupError(ArrowaggError):
    """The broker is unreachable or a topic is missing; one line for the user."""


# Where the broker's address is set, as an error's hint names it until a command line,
# which knows where its address came from, names the real place (``mended_at``).
BOOTSTRAP_SETTING = "kafka.bootstrap_servers or KAFKA_BOOTSTRAP_SERVERS"
CREATE_COMMAND = "python -m consumer topics create --config CONFIG"


class KafkaUnreachableError(KafkaSetupError):
    """No broker answered at the bootstrap servers."""

    def __init__(self, problem: str, where: str = BOOTSTRAP_SETTING) -> None:
        super().__init__(f"{problem}; check {where}")
        self.problem = problem

    def mended_at(self, where: str) -> KafkaUnreachableError:
        """The same error, naming ``where`` the address was set (a flag, a file's key)."""
        return KafkaUnreachableError(self.problem, where)


class MissingTopicsError(KafkaSetupError):
    """Topics the daemon needs do not exist."""

    def __init__(self, problem: str, create: str = CREATE_COMMAND) -> None:
        super().__init__(f"{problem}; create them: {create}")
        self.problem = problem

    def mended_at(self, create: str) -> MissingTopicsError:
        """The same error, naming the command that creates them for this config."""
        return MissingTopicsError(self.problem, create)


RebalanceCallback = Callable[[Any, list[TopicPartition]], None]


class InputConsumer(Protocol):
    """The part of confluent_kafka's Consumer the run loop and the sinks use; an
    in-memory fake (tests/consumer/kafka/fake_broker.py) implements it too."""

    def subscribe(self, topics: list[str], on_assign: RebalanceCallback | None = None,
                  on_revoke: RebalanceCallback | None = None,
                  on_lost: RebalanceCallback | None = None) -> None: ...
    def poll(self, timeout: float = -1) -> Message | None: ...
    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]: ...
    def assignment(self) -> list[TopicPartition]: ...
    def committed(self, partitions: list[TopicPartition],
                  timeout: float = -1) -> list[TopicPartition]: ...
    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]: ...
    def get_watermark_offsets(self, partition: TopicPartition, timeout: float = -1,
                              cached: bool = False) -> tuple[int, int]: ...  # noqa: FBT001, FBT002
    def seek(self, partition: TopicPartition) -> None: ...
    def pause(self, partitions: list[TopicPartition]) -> None: ...
    def resume(self, partitions: list[TopicPartition]) -> None: ...
    def commit(self, *, offsets: list[TopicPartition],
               asynchronous: Literal[False]) -> list[TopicPartition]: ...
    def consumer_group_metadata(self) -> Any: ...
    def close(self) -> None: ...


def _common(kafka: KafkaSettings) -> dict[str, Any]:
    return {
        "bootstrap.servers": kafka.bootstrap_servers,
        "client.id": kafka.client_id,
        "logger": librdkafka_logger(),
        **security_config(kafka.security),
    }


def security_config(security: SecuritySettings) -> dict[str, Any]:
    """The librdkafka keys for ``kafka.security``; unset options are left out."""
    config: dict[str, Any] = {"security.protocol": security.security_protocol.lower()}
    paths = {"ssl.ca.location": security.ssl_ca_location,
             "ssl.certificate.location": security.ssl_certificate_location,
             "ssl.key.location": security.ssl_key_location}
    config.update({key: str(path) for key, path in paths.items() if path is not None})
    if security.ssl_key_password is not None:
        config["ssl.key.password"] = security.ssl_key_password.get_secret_value()
    if security.security_protocol.startswith("SASL_"):
        config["sasl.mechanism"] = security.sasl_mechanism
        config["sasl.username"] = security.sasl_username
        if security.sasl_password is not None:
            config["sasl.password"] = security.sasl_password.get_secret_value()
    return config


def instance_id(processing: ProcessingSettings) -> str:
    return processing.instance_id or socket.gethostname()


def daemon_identity(settings: Settings) -> str:
    """``<group_id>-<instance_id>``: one running daemon (its transactional.id)."""
    return f"{settings.kafka.group_id}-{instance_id(settings.processing)}"


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
        # librdkafka's default (50 MB) let one response fill with four partitions' 16 MB:
        # reading 1 GB then cost 0.7-0.9 s of system time (page faults on fresh buffers;
        # glibc maps every allocation above 32 MB anew), against 0.3 s with 16 MB. The
        # raw reader is ~25% faster and the daemon ~20% (docs/benchmark-findings.md).
        "fetch.max.bytes": 16 * 1024 * 1024,
        # Prefetch while a batch is aggregated. When the local queue is full librdkafka
        # stops fetching for fetch.queue.backoff.ms (default 1 s): the daemon drains the
        # queue in bursts, so with the default it sat idle for seconds in every GB. The
        # backoff is the cure; the queue stays at librdkafka's 64 MB. 256 MB gave larger
        # polls (12% faster a GB where freed memory stays with the machine) but holds
        # 192 MB more, and on a VM that hands freed memory back to its host (virtio
        # free page reporting) its extra page faults ran the daemon 1.8-5.2 s a GB
        # against 1.8-3.1 s (docs/benchmark-findings.md).
        "queued.max.messages.kbytes": 64 * 1024,
        "fetch.queue.backoff.ms": 10,
        "enable.partition.eof": False,
        **kafka.consumer,
    }


def take_batch(consumer: InputConsumer, max_messages: int, timeout_s: float) -> list[Message]:
    """What the client has fetched, up to ``max_messages``, without waiting; when nothing
    is there, the first message to arrive within ``timeout_s`` and what came with it.

    ``consume(n, timeout)`` alone waits for n messages or the whole timeout: with a
    backlog of large messages the local queue rarely holds n, and on a quiet stream every
    window close would wait out the timeout.
    """
    messages = consumer.consume(max_messages, 0)
    if messages:
        return messages
    first = consumer.poll(timeout_s)
    if first is None:
        return []
    if max_messages == 1:
        return [first]
    return [first, *consumer.consume(max_messages - 1, 0)]


def producer_config(kafka: KafkaSettings, processing: ProcessingSettings, *,
                    max_message_bytes: int = 1_000_000) -> dict[str, Any]:
    """``max_message_bytes``: the largest record value the daemon produces (windows,
    late rows and dead letters are all cut to it)."""
    config: dict[str, Any] = {
        **_common(kafka),
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        # A topic's max.message.bytes limits a whole record batch, not one record: with
        # librdkafka's 1 MB default, four 100 kB late records made a batch the late topic
        # refused, every time the transaction was replayed.
        "batch.size": max_message_bytes,
        "compression.type": "none",  # output values are Arrow-compressed already
        # librdkafka's default "rebootstrap" left send_offsets_to_transaction blocked for
        # good after a full broker outage (its timeout never fired); "none" rides it out.
        "metadata.recovery.strategy": "none",
    }
    if processing.guarantee == "exactly_once":
        config["transactional.id"] = f"{kafka.group_id}-{instance_id(processing)}"
        config["transaction.timeout.ms"] = 60_000
        # A transactional request sent as the broker went down waited out librdkafka's
        # request timeout (socket.timeout.ms, which the transaction timeout caps at 60 s)
        # whatever timeout the call was given: send_offsets_to_transaction(..., 30)
        # returned "Timed out (after 60042ms)", the run loop stalled a minute after a
        # 2 s outage. A shorter one bounds the stall; the call is then retried.
        config["socket.timeout.ms"] = 20_000
    return {**config, **kafka.producer}


def quiet_config(kafka: KafkaSettings, errors: list[KafkaError]) -> dict[str, Any]:
    """A client configuration for short-lived admin and reader clients: security included,
    librdkafka's log off (it would repeat a failure once per retry), its errors collected
    in ``errors`` to be summed up in one line."""
    return {**_common(kafka), **_admin_keys(kafka), "log_level": 0, "error_cb": errors.append}


def cluster_metadata(client: AdminClient | Consumer, kafka: KafkaSettings,
                     errors: list[KafkaError], timeout_s: float) -> ClusterMetadata:
    """All topics' metadata; KafkaSetupError (one line) when no broker answers in time.

    Asks for every topic rather than some: asking for one may auto-create it."""
    if (refused := nothing_listens(kafka.bootstrap_servers)) is not None:
        # No broker can answer: say so now rather than after the whole timeout.
        raise KafkaUnreachableError(f"cannot reach Kafka at {kafka.bootstrap_servers} "
                                     f"({refused})")
    try:
        metadata: ClusterMetadata = client.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        client.poll(0.1)  # serves error_cb
        raise _unreachable(kafka, timeout_s, exc.args[0], errors) from exc
    return metadata


def check_topics(kafka: KafkaSettings, topics: list[str], *, timeout_s: float = 5.0,
                 max_message_bytes: Mapping[str, tuple[int, str]] | None = None) -> None:
    """Fail fast, with one line, when the broker does not answer, refuses our credentials,
    a topic is missing, or a topic takes smaller messages than the daemon writes to it
    (``max_message_bytes``: topic -> (bytes needed, the setting that needs them)); such a
    message would stop the daemon on every restart."""
    errors: list[KafkaError] = []
    admin = AdminClient(quiet_config(kafka, errors))
    metadata = cluster_metadata(admin, kafka, errors, timeout_s)
    missing = [t for t in topics if t not in metadata.topics]
    if missing:
        raise MissingTopicsError(
            f"topic(s) {', '.join(missing)} do not exist on {kafka.bootstrap_servers}")
    needs = max_message_bytes or {}
    limits = topic_message_limits(admin, list(needs), timeout_s)
    for topic, (needed, setting) in needs.items():
        limit = limits.get(topic)
        if limit is not None and limit < needed:
            raise KafkaSetupError(too_small_message(topic, limit, needed, setting))


def too_small_message(topic: str, limit: int, needed: int, setting: str) -> str:
    return (f"topic {topic} takes messages of at most {limit} bytes (max.message.bytes), "
            f"but {setting} needs {needed}: raise it (kafka-configs.sh --alter --entity-type "
            f"topics --entity-name {topic} --add-config max.message.bytes={needed}) or "
            f"lower {setting}")


def topic_message_limits(admin: AdminClient, topics: list[str],
                         timeout_s: float) -> dict[str, int]:
    """Each topic's max.message.bytes; a topic we may not describe is left out (logged)."""
    if not topics:
        return {}
    resources = [ConfigResource(ResourceType.TOPIC, topic) for topic in topics]
    limits: dict[str, int] = {}
    for resource, future in admin.describe_configs(resources,
                                                   request_timeout=timeout_s).items():
        try:
            entries = future.result(timeout=timeout_s)
        except KafkaException as exc:
            log.warning("cannot read the configuration of topic %s (%s): its "
                        "max.message.bytes is not checked", resource.name, exc.args[0].str())
            continue
        limits[resource.name] = int(entries["max.message.bytes"].value)
    return limits


def _unreachable(kafka: KafkaSettings, timeout_s: float, error: KafkaError,
                 seen: list[KafkaError]) -> KafkaSetupError:
    where = kafka.bootstrap_servers
    auth = next((e for e in seen if e.code() == KafkaError._AUTHENTICATION), None)
    if auth is not None:
        return KafkaSetupError(
            f"Kafka at {where} refused to authenticate us ({_reason(auth)}); check "
            "kafka.security: security_protocol, sasl_mechanism, sasl_username, "
            "sasl_password (or its file / ARROWAGG_KAFKA__SECURITY__SASL_PASSWORD)")
    detail = _reason(seen[0]) if seen else error.str()
    return KafkaUnreachableError(f"cannot reach Kafka at {where} within {timeout_s:.0f}s "
                                  f"({detail})")


def _reason(error: KafkaError) -> str:
    """librdkafka's message without the broker prefix and the '(after Nms in state X)'."""
    return _BROKER_PREFIX.sub("", error.str()).split(" (after ", 1)[0]


def _admin_keys(kafka: KafkaSettings) -> dict[str, Any]:
    # Security settings apply to every client; consumer-only keys would be rejected.
    return {k: v for k, v in kafka.consumer.items()
            if k.startswith(("security.", "sasl.", "ssl."))}


def _admin(kafka: KafkaSettings, errors: list[KafkaError]) -> AdminClient:
    config: dict[str, Any] = {**_common(kafka), **_admin_keys(kafka), "log_level": 0,
                              "error_cb": errors.append}
    return AdminClient(config)


def ensure_repartition_topic(kafka: KafkaSettings, scale_out: ScaleOutSettings, *,
                             timeout_s: float = 10.0) -> None:
    """Create the scale-out's repartition topic when it is missing; one line when it
    exists with another partition count (its partitions are the hash's buckets: changing
    them would send a group's partials to two places)."""
    errors: list[KafkaError] = []
    admin = _admin(kafka, errors)
    name, wanted = scale_out.repartition_topic, scale_out.partitions
    topics = cluster_metadata(admin, kafka, errors, timeout_s).topics
    if name in topics:
        have = len(topics[name].partitions)
        if have != wanted:
            raise KafkaSetupError(
                f"scale_out.repartition_topic {name!r} has {have} partitions, the config "
                f"says {wanted}; set scale_out.partitions to {have}, or drain it (stop "
                "every instance once its lag is 0) and delete it")
        return
    replication = scale_out.replication_factor or -1  # -1: the broker's default
    future = admin.create_topics([NewTopic(name, num_partitions=wanted,
                                           replication_factor=replication)])[name]
    try:
        future.result(timeout=timeout_s)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # another instance won
            raise KafkaSetupError(f"cannot create {name!r}: {exc.args[0].str()}") from exc
    log.info("created the repartition topic %s with %d partitions", name, wanted)


def topic_partitions(kafka: KafkaSettings, topics: list[str], *,
                     timeout_s: float = 10.0) -> set[tuple[str, int]]:
    """Every (topic, partition) of ``topics``, as the broker lists them now."""
    errors: list[KafkaError] = []
    metadata = cluster_metadata(_admin(kafka, errors), kafka, errors, timeout_s)
    return {(topic, partition) for topic in topics if topic in metadata.topics
            for partition in metadata.topics[topic].partitions}
