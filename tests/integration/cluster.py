"""A three-node Kafka cluster of the test's own (``scripts/kafka-local start --cluster 3``)
whose nodes can be SIGKILLed and brought back one at a time, and the questions a fault
test asks it: which node leads a partition, which node coordinates a transactional.id or
a consumer group, and whether every replica is back in sync."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from contextlib import suppress
from pathlib import Path

from confluent_kafka import Consumer, ElectionType, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._metadata import PartitionMetadata  # not re-exported
from confluent_kafka.cimpl import NewTopic

from tests.conftest import KAFKA_LOCAL

TRANSACTION_STATE = "__transaction_state"
CONSUMER_OFFSETS = "__consumer_offsets"
QUORUM_LEADER = re.compile(r"In the new epoch (\d+), the leader is (\d+)\.")


class LocalCluster:
    """``scripts/kafka-local`` in a state directory of its own, in cluster mode.

    ``kill`` is a crash (SIGKILL, no controlled shutdown); ``bring_back`` starts the node
    on its own data dir, ports and cluster id and returns once it answers again.
    """

    def __init__(self, state_dir: Path, bootstrap: str, *, start_s: float) -> None:
        self.state_dir = state_dir
        self.bootstrap = bootstrap
        self.start_s = start_s  # from `kafka-local start` to every node live
        self.node_ids = list(range(1, bootstrap.count(",") + 2))
        self.admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})

    @classmethod
    def start(cls, state_dir: Path, nodes: int = 3) -> LocalCluster:
        began = time.monotonic()
        started = _kafka_local(state_dir, "start", "--cluster", str(nodes))
        if started.returncode != 0:
            _kafka_local(state_dir, "stop")
            raise AssertionError(f"kafka-local start --cluster failed:\n{started.stderr}")
        return cls(state_dir, started.stdout.strip().splitlines()[-1],
                   start_s=time.monotonic() - began)

    def kill(self, node: int) -> None:
        killed = _kafka_local(self.state_dir, "stop", "--node", str(node), "--kill")
        assert killed.returncode == 0, killed.stderr

    def bring_back(self, node: int) -> None:
        started = _kafka_local(self.state_dir, "start", "--node", str(node))
        assert started.returncode == 0, f"node {node} did not come back:\n{started.stderr}"

    def stop(self) -> None:
        _kafka_local(self.state_dir, "stop")

    def server_log(self, node: int) -> str:
        path = self.state_dir / f"node-{node}" / "logs" / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def quorum_leader(self) -> int | None:
        """The active controller, from the newest "In the new epoch E, the leader is N"
        of any node's log (clients of brokers are told a random broker instead)."""
        newest: tuple[int, int] | None = None
        for node in self.node_ids:
            for epoch, leader in QUORUM_LEADER.findall(self.server_log(node)):
                newest = max(newest or (-1, -1), (int(epoch), int(leader)))
        return newest[1] if newest else None

    def log_tails(self, chars: int = 3000) -> str:
        return _kafka_local(self.state_dir, "logs").stdout[-chars:]


def _kafka_local(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KAFKA_LOCAL_DIR": str(state_dir)}
    return subprocess.run([sys.executable, str(KAFKA_LOCAL), *args], capture_output=True,
                          text=True, check=False, timeout=180, env=env)


# -- placement: who leads, who coordinates ----------------------------------------------


def create_placed_topic(admin: AdminClient, name: str, replicas: list[list[int]]) -> None:
    """A topic with one partition per entry of ``replicas``; each entry's first node is
    that partition's preferred leader."""
    future = admin.create_topics([NewTopic(name, len(replicas), replica_assignment=replicas)],
                                 operation_timeout=30)[name]
    future.result(timeout=30)


def partitions(admin: AdminClient, topic: str) -> list[PartitionMetadata]:
    """``topic``'s partitions (leader, replicas, in-sync replicas) as a Metadata request
    answers now. Not ``describe_topics``: librdkafka sends that to the controller id it
    cached, which after a kill can name the dead node for minutes ("Timed out waiting
    for controller")."""
    described = admin.list_topics(topic, timeout=10).topics[topic]
    if described.error is not None:
        raise KafkaException(described.error)
    return [described.partitions[p] for p in sorted(described.partitions)]


def leaders(admin: AdminClient, topic: str) -> list[int | None]:
    """Each partition's leader (None: it has none)."""
    return [p.leader if p.leader >= 0 else None for p in partitions(admin, topic)]


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()``: over UTF-16 code units, in 32-bit arithmetic."""
    units = text.encode("utf-16-be")
    value = 0
    for i in range(0, len(units), 2):
        value = (31 * value + int.from_bytes(units[i:i + 2], "big")) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def coordinator_partition(key: str, count: int) -> int:
    """The partition of ``__transaction_state`` (for a transactional.id) or of
    ``__consumer_offsets`` (for a group id), of ``count``, whose leader coordinates
    ``key``: Kafka's ``Utils.abs(key.hashCode()) % count``. confluent-kafka has no FindCoordinator
    for transactions (nor describe_transactions), so the tests compute it."""
    value = java_string_hash(key)
    return (0 if value == -(1 << 31) else abs(value)) % count


def coordinator(admin: AdminClient, internal_topic: str, key: str) -> int | None:
    described = partitions(admin, internal_topic)
    leader = described[coordinator_partition(key, len(described))].leader
    return leader if leader >= 0 else None


def key_coordinated_by(admin: AdminClient, internal_topic: str, node: int,
                       key: Callable[[int], str]) -> str:
    """The first of ``key(0), key(1), ...`` whose coordinator partition has ``node`` as
    its preferred leader: it places a transactional.id or a group on a chosen node."""
    preferred = [p.replicas[0] for p in partitions(admin, internal_topic)]
    assert node in preferred, f"node {node} leads no partition of {internal_topic}"
    n = 0
    while preferred[coordinator_partition(key(n), len(preferred))] != node:
        n += 1
    return key(n)


def create_internal_topics(cluster: LocalCluster) -> None:
    """Kafka creates ``__consumer_offsets`` and ``__transaction_state`` on first use; use
    them once, so their placement can be read before the test chooses its ids."""
    create_placed_topic(cluster.admin, "warm-up", [cluster.node_ids])
    producer = Producer({"bootstrap.servers": cluster.bootstrap,
                         "transactional.id": "warm-up", "log_level": 0})
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce("warm-up", b"x")
    producer.commit_transaction(60)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "warm-up",
                         "enable.auto.commit": False, "log_level": 0})
    try:
        consumer.commit(offsets=[TopicPartition("warm-up", 0, 1)], asynchronous=False)
    finally:
        consumer.close()


def answered(condition: Callable[[], bool]) -> Callable[[], bool]:
    """``condition`` for ``wait_until``, false while the cluster cannot answer it (the
    client may still be asking a node that was just killed)."""

    def asked() -> bool:
        try:
            return condition()
        except (KafkaException, TimeoutError):
            return False

    return asked


# -- replication -------------------------------------------------------------------------


def out_of_sync(admin: AdminClient, topics: Iterable[str], nodes: int) -> list[str]:
    """The partitions (``topic-N``) with fewer than ``nodes`` replicas in sync."""
    return [f"{topic}-{p.id}" for topic in topics for p in partitions(admin, topic)
            if len(p.isrs) < nodes]


def restore_preferred_leaders(cluster: LocalCluster, topics: Iterable[str]) -> bool:
    """Ask for a preferred-leader election on every partition of ``topics`` that is led
    by another node; True once each is led by its preferred (first) replica."""
    astray = [TopicPartition(topic, p.id) for topic in topics
              for p in partitions(cluster.admin, topic) if p.leader != p.replicas[0]]
    if not astray:
        return True
    # A new client: elections go to the controller id a client cached (see partitions).
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    # No request_timeout: confluent-kafka 2.16's elect_leaders fails on it (SystemError).
    future = admin.elect_leaders(ElectionType.PREFERRED, astray)
    with suppress(KafkaException, TimeoutError):  # the caller asks until it took effect
        future.result(timeout=15)
    return False
