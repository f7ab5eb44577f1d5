"""The daemon's topics: what each needs, what exists, and creating the missing ones
(``python -m consumer topics create``).

A topic's ``max.message.bytes`` bounds a whole record batch, so each topic is sized for
the largest message the daemon's configuration lets onto it plus ``RECORD_OVERHEAD_BYTES``
for the key, the headers and Kafka's framing: the input topic for
``input.max_message_bytes``; the output and late topics for ``output.max_message_bytes``;
the dead-letter topic for both, since a dead letter carries the input message it rejects.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from consumer.config import InputSettings, KafkaSettings, OutputSettings
from consumer.kafka.clients import (
    cluster_metadata,
    quiet_config,
    too_small_message,
    topic_message_limits,
)
from wire.errors import UsageError

RECORD_OVERHEAD_BYTES: Final = 4096
DEFAULT_INPUT_PARTITIONS: Final = 3
DEFAULT_OUTPUT_PARTITIONS: Final = 1
PREFERRED_REPLICATION: Final = 3

_MENDS: Final = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "our principal needs the Create ACL on it",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "our principal needs the Create ACL on the "
                                             "cluster or the topic",
    KafkaError.POLICY_VIOLATION: "the broker's create.topic.policy refuses it",
}


@dataclass(frozen=True)
class TopicSpec:
    """A topic the configuration names, and what it should be created with."""

    name: str
    role: str  # input, output, late or dlq
    partitions: int
    max_message_bytes: int


@dataclass(frozen=True)
class TopicState:
    """What a topic on the broker is (``max_message_bytes`` None: not allowed to read it)."""

    name: str
    partitions: int
    replication: int
    max_message_bytes: int | None

    def describe(self) -> str:
        size = "?" if self.max_message_bytes is None else str(self.max_message_bytes)
        return (f"{_plural(self.partitions, 'partition')}, replication factor "
                f"{self.replication}, max.message.bytes {size}")


Action = Literal["created", "would create", "exists", "failed"]


@dataclass(frozen=True)
class TopicOutcome:
    spec: TopicSpec
    action: Action
    state: TopicState | None  # what the broker then holds (None: not known)
    problem: str | None = None  # why it failed, or why the daemon would refuse it


def output_message_bytes(output: OutputSettings) -> int:
    """The max.message.bytes that output.max_message_bytes needs of a topic."""
    return output.max_message_bytes + RECORD_OVERHEAD_BYTES


def needed_message_bytes(output: OutputSettings) -> dict[str, tuple[int, str]]:
    """Output, late and dead-letter topic -> (max.message.bytes needed, the setting): what
    the daemon checks at start, since a record the topic refuses stops it every time."""
    needed = output_message_bytes(output)
    return {topic: (needed, "output.max_message_bytes")
            for topic in (output.topic, output.late_topic, output.dlq_topic)
            if topic is not None}


def topic_specs(inputs: InputSettings, output: OutputSettings, *, input_partitions: int,
                output_partitions: int) -> list[TopicSpec]:
    input_bytes = inputs.max_message_bytes + RECORD_OVERHEAD_BYTES
    specs = [TopicSpec(t, "input", input_partitions, input_bytes) for t in inputs.topics]
    output_bytes = output_message_bytes(output)
    specs.append(TopicSpec(output.topic, "output", output_partitions, output_bytes))
    if output.late_topic is not None:
        specs.append(TopicSpec(output.late_topic, "late", output_partitions, output_bytes))
    if output.dlq_topic is not None:
        specs.append(TopicSpec(output.dlq_topic, "dlq", output_partitions,
                               max(input_bytes, output_bytes)))
    return specs


def create_topics(kafka: KafkaSettings, specs: list[TopicSpec], *, needed: Mapping[str, int],
                  replication_factor: int | None = None, timeout_s: float = 10.0,
                  dry_run: bool = False) -> list[TopicOutcome]:
    """Create the topics of ``specs`` that do not exist; leave the others alone, but say
    when one takes smaller messages than ``needed`` (topic -> max.message.bytes).

    The replication factor defaults to 3, or the number of brokers when there are fewer.
    With ``dry_run`` the broker only validates the creations."""
    errors: list[KafkaError] = []
    admin = AdminClient(quiet_config(kafka, errors))
    metadata = cluster_metadata(admin, kafka, errors, timeout_s)
    brokers = len(metadata.brokers)
    replication = replication_factor or min(PREFERRED_REPLICATION, brokers)
    if replication > brokers:
        raise UsageError(f"replication factor {replication} needs {replication} brokers, "
                         f"and {kafka.bootstrap_servers} has {brokers}; "
                         "lower --replication-factor")
    missing = [spec for spec in specs if spec.name not in metadata.topics]
    actions = dict(_create(admin, missing, replication, timeout_s, dry_run=dry_run))
    _wait_listed(admin, [n for n, (action, _) in actions.items() if action == "created"],
                 timeout_s)
    states = describe_topics(kafka, [s.name for s in specs], timeout_s)
    outcomes = []
    for spec in specs:
        action, problem = actions.get(spec.name, ("exists", None))
        state = states.get(spec.name)
        if action == "exists" and state is not None:
            problem = _too_small(state, needed.get(spec.name))
        outcomes.append(TopicOutcome(spec, action, state, problem))
    return outcomes


def describe_topics(kafka: KafkaSettings, names: Iterable[str],
                    timeout_s: float) -> dict[str, TopicState]:
    """The topics of ``names`` that exist: partitions, replication, max.message.bytes."""
    errors: list[KafkaError] = []
    admin = AdminClient(quiet_config(kafka, errors))
    metadata = cluster_metadata(admin, kafka, errors, timeout_s)
    found = [name for name in dict.fromkeys(names) if name in metadata.topics]
    limits = topic_message_limits(admin, found, timeout_s)
    states = {}
    for name in found:
        partitions = metadata.topics[name].partitions
        replicas = min((len(p.replicas) for p in partitions.values()), default=0)
        states[name] = TopicState(name, len(partitions), replicas, limits.get(name))
    return states


def _wait_listed(admin: AdminClient, names: list[str], timeout_s: float) -> None:
    """Until the broker's metadata lists every topic of ``names`` with its leaders.

    CreateTopics answers once the controller has a topic; the broker answering clients'
    metadata learns it a moment later, and a worker publishing right after `topics
    create` (as the demo does) was told the topic did not exist."""
    deadline = time.monotonic() + timeout_s
    while names and time.monotonic() < deadline:
        topics = admin.list_topics(timeout=timeout_s).topics
        if all(name in topics and topics[name].partitions and all(
                p.leader >= 0 for p in topics[name].partitions.values()) for name in names):
            return
        time.sleep(0.05)


def _too_small(state: TopicState, needed: int | None) -> str | None:
    limit = state.max_message_bytes
    if needed is None or limit is None or limit >= needed:
        return None
    return too_small_message(state.name, limit, needed, "output.max_message_bytes")


def _create(admin: AdminClient, specs: list[TopicSpec], replication: int, timeout_s: float,
            *, dry_run: bool) -> Iterator[tuple[str, tuple[Action, str | None]]]:
    """Topic -> (what became of it, the problem if it failed)."""
    if not specs:
        return
    new = [NewTopic(spec.name, num_partitions=spec.partitions, replication_factor=replication,
                    config={"max.message.bytes": str(spec.max_message_bytes)})
           for spec in specs]
    futures = admin.create_topics(new, operation_timeout=timeout_s, request_timeout=timeout_s,
                                  validate_only=dry_run)
    for spec in specs:
        try:
            futures[spec.name].result(timeout=timeout_s)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.code() == KafkaError.TOPIC_ALREADY_EXISTS:  # made meanwhile
                yield spec.name, ("exists", None)
                continue
            mend = _MENDS.get(error.code())
            yield spec.name, ("failed", f"cannot create topic {spec.name}: {error.str()}"
                              + (f" ({mend})" if mend else ""))
            continue
        yield spec.name, ("would create" if dry_run else "created", None)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
