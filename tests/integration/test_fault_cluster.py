"""Nodes of a three-node cluster fail under a running daemon. The leader of the input
partitions, the leader of the output partition and the coordinator of the daemon's
transactional.id (and of its group) are SIGKILLed mid-stream, five kills in all, while
a publisher keeps writing, and brought back on the same data and ports. With replication
factor 3 and min.insync.replicas 2 the one daemon process, never restarted, commits again
while the node is still down; the committed output equals the reference, no (window,
keys) row twice, nothing lost, and no transaction is left hanging."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from polars.testing import assert_frame_equal

from tests.integration.broker_faults import (
    IDLE_TIMEOUT_MS,
    PARTITIONS,
    SPAN_MS,
    event_time_batches,
    stuck_daemon_report,
)
from tests.integration.cluster import (
    CONSUMER_OFFSETS,
    TRANSACTION_STATE,
    LocalCluster,
    answered,
    coordinator,
    coordinator_partition,
    create_internal_topics,
    create_placed_topic,
    key_coordinated_by,
    leaders,
    out_of_sync,
    partitions,
    restore_preferred_leaders,
)
from tests.integration.daemon_runs import SIZE_MS, sorted_rows, start_daemon, write_config
from tests.integration.data import KEYS, T0, output_frame, reference, sensor_table
from tests.integration.faults import (
    DurablePublisher,
    PacedPublishing,
    end_offsets,
    group_committed,
    hanging_transactions,
    read_topic,
    repeated_groups,
    wait_until,
    write_figures,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NODES = 3
INPUT_LEADER = "input leader"
OUTPUT_LEADER = "output leader"
COORDINATOR = "transaction coordinator"
# Where each role lives while every node is up: one role per node, so that each kill
# fails one of them (the daemon's group coordinator shares node 3 with its transaction
# coordinator). After each kill the preferred leaders are restored, so it stays so.
PLACEMENT = {INPUT_LEADER: 1, OUTPUT_LEADER: 2, COORDINATOR: 3}
# Each role once, then the two on the transaction's own path again: five kills keep the
# test near two minutes on a loaded 2-core machine (a kill, the failover, the commit and
# the node's restart take 13-22 s).
KILLS = (INPUT_LEADER, OUTPUT_LEADER, COORDINATOR, OUTPUT_LEADER, COORDINATOR)
WAIT_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster.start(tmp_path_factory.mktemp("kafka-cluster"), NODES)
    try:
        create_internal_topics(cluster)
        yield cluster
    finally:
        cluster.stop()


def preferring(node: int) -> list[int]:
    """Replicas on every node, ``node`` first: the partition's preferred leader."""
    return [node, *(n for n in range(1, NODES + 1) if n != node)]


@dataclass(frozen=True)
class DaemonRoles:
    """Which nodes serve the daemon, as the cluster's metadata says now."""

    cluster: LocalCluster
    source: str
    sink: str
    late: str
    group: str
    transactional_id: str

    @property
    def topics(self) -> list[str]:
        return [self.source, self.sink, self.late, CONSUMER_OFFSETS, TRANSACTION_STATE]

    def holders(self, role: str) -> set[int | None]:
        admin = self.cluster.admin
        if role == INPUT_LEADER:
            return set(leaders(admin, self.source))
        if role == OUTPUT_LEADER:
            return set(leaders(admin, self.sink)) | set(leaders(admin, self.late))
        return {coordinator(admin, TRANSACTION_STATE, self.transactional_id)}

    def held_by(self, node: int) -> list[str]:
        """Every role of ``node``, the group coordinator and the active controller too."""
        held = [role for role in PLACEMENT if node in self.holders(role)]
        if coordinator(self.cluster.admin, CONSUMER_OFFSETS, self.group) == node:
            held.append("group coordinator")
        if self.cluster.quorum_leader() == node:
            held.append("active controller")
        return held


def place_the_daemon(cluster: LocalCluster, tmp_path: Path) -> tuple[DaemonRoles, Path]:
    """Topics led by their planned nodes, and a group and transactional.id whose
    coordinators are on node 3; returns the roles and the daemon's config."""
    admin = cluster.admin
    source, sink, late = "in-cluster-faults", "out-cluster-faults", "late-cluster-faults"
    create_placed_topic(admin, source, [preferring(PLACEMENT[INPUT_LEADER])] * PARTITIONS)
    for topic in (sink, late):
        create_placed_topic(admin, topic, [preferring(PLACEMENT[OUTPUT_LEADER])])
    node = PLACEMENT[COORDINATOR]
    group = key_coordinated_by(admin, CONSUMER_OFFSETS, node, lambda n: f"g-cluster-{n}")
    transactional_id = key_coordinated_by(admin, TRANSACTION_STATE, node,
                                          lambda n: f"{group}-instance-{n}")
    config = write_config(tmp_path / "config.yaml", cluster.bootstrap, source, sink, group,
                          instance_id=transactional_id.removeprefix(f"{group}-"))
    data: dict[str, Any] = yaml.safe_load(config.read_text())
    data["window"]["idle_timeout_ms"] = IDLE_TIMEOUT_MS  # above any failover, as there
    data["output"]["late_topic"] = late
    config.write_text(yaml.safe_dump(data))
    return DaemonRoles(cluster, source, sink, late, group, transactional_id), config


def check_the_placement(roles: DaemonRoles) -> None:
    """The coordinators are where the hash says, by the brokers' own word: the group's
    by FindCoordinator, the transactional.id's by its coordinator's log."""
    admin = roles.cluster.admin
    group = admin.describe_consumer_groups([roles.group])[roles.group].result(timeout=15)
    assert group.coordinator.id == PLACEMENT[COORDINATOR]
    partition = coordinator_partition(roles.transactional_id,
                                      len(partitions(admin, TRANSACTION_STATE)))
    logged = (f"Initialized transactionalId {roles.transactional_id} with producerId",
              f"on partition {TRANSACTION_STATE}-{partition} ")
    log = roles.cluster.server_log(PLACEMENT[COORDINATOR])
    assert any(all(s in line for s in logged) for line in log.splitlines()), logged


class Run:
    """The daemon under test and the questions asked about its progress."""

    def __init__(self, roles: DaemonRoles, daemon: subprocess.Popen[bytes], log: Path) -> None:
        self.roles = roles
        self.daemon = daemon
        self.log = log

    def committed(self) -> list[int]:
        return group_committed(self.roles.cluster.bootstrap, self.roles.group,
                               self.roles.source, PARTITIONS)

    def exited(self) -> bool:
        return self.daemon.poll() is not None

    def wait(self, condition: Callable[[], bool], what: str) -> None:
        """Wait for ``condition``, or fail with the daemon's stacks and log."""
        try:
            wait_until(lambda: self.exited() or condition(), timeout_s=WAIT_S, what=what)
        except AssertionError as err:
            pytest.fail(stuck_daemon_report(self.daemon, self.log, str(err)) +
                        f"\nbroker logs:\n{self.roles.cluster.log_tails()}")
        assert not self.exited(), f"the daemon exited:\n{self.log.read_text()[-4000:]}"


def kill_and_bring_back(run: Run, role: str) -> dict[str, Any]:
    """SIGKILL the node holding ``role``, see the role move and the daemon commit again
    with the node down, bring the node back and wait until the cluster is whole."""
    roles, cluster = run.roles, run.roles.cluster
    node = PLACEMENT[role]
    # A node fenced for a slow heartbeat meanwhile would have moved some leaders.
    run.wait(answered(lambda: restore_preferred_leaders(cluster, roles.topics)
                      and roles.holders(role) == {node}), f"the {role} on node {node}")
    held = roles.held_by(node)
    before = run.committed()
    assert min(before) > 0, f"committed offsets unreadable before the kill: {before}"
    killed_at = time.monotonic()
    cluster.kill(node)

    def moved() -> bool:
        now = roles.holders(role)
        return node not in now and None not in now

    run.wait(answered(moved), f"the {role} to move off node {node}")
    moved_s = time.monotonic() - killed_at
    run.wait(lambda: all(n > b for n, b in zip(run.committed(), before, strict=True)),
             f"the daemon to commit every partition with node {node} down")
    committed_s = time.monotonic() - killed_at
    cluster.bring_back(node)
    back_s = time.monotonic() - killed_at
    run.wait(answered(lambda: not out_of_sync(cluster.admin, roles.topics, NODES)),
             f"every replica in sync again after node {node} came back")
    run.wait(answered(lambda: restore_preferred_leaders(cluster, roles.topics)),
             "the preferred leaders restored")
    return {"role": role, "node": node, "node_held": held,
            "role_moved_after_s": round(moved_s, 1),
            "daemon_committed_after_s": round(committed_s, 1),
            "node_back_after_s": round(back_s, 1),
            "whole_again_after_s": round(time.monotonic() - killed_at, 1)}


def finish(run: Run, publisher: DurablePublisher, rng: random.Random) -> int:
    """One batch per partition far ahead in event time closes every window before it;
    wait until the daemon committed past them, stop it with SIGTERM; returns how many
    batches were real input."""
    real_batches = len(publisher.published)
    last_ms = T0 + (real_batches // PARTITIONS + 1) * SPAN_MS
    sentinel_ms = (last_ms // SIZE_MS + 5) * SIZE_MS
    for partition in range(PARTITIONS):
        publisher.publish(partition, sensor_table(rng, 1, sentinel_ms, 1))
    publisher.flush()
    sentinels = [end - 1 for end in end_offsets(run.roles.cluster.admin, run.roles.source,
                                                PARTITIONS)]
    run.wait(lambda: run.committed() == sentinels, "every window before the sentinels")
    run.daemon.send_signal(signal.SIGTERM)
    code = run.daemon.wait(30)
    assert code == 0, f"SIGTERM exit code {code}:\n{run.log.read_text()[-4000:]}"
    return real_batches


def test_killing_leaders_and_the_coordinator_loses_nothing_and_duplicates_nothing(
    cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTHONFAULTHANDLER", "1")  # the daemon can dump its stacks
    started = time.monotonic()
    roles, config = place_the_daemon(cluster, tmp_path)
    log = tmp_path / "daemon.log"
    rng = random.Random(23)
    publisher = DurablePublisher(cluster.bootstrap, roles.source)
    publishing: PacedPublishing | None = None
    run = Run(roles, start_daemon(config, log), log)
    try:
        publishing = PacedPublishing(publisher, event_time_batches(rng), pause_s=0.03)
        run.wait(lambda: min(run.committed()) > 0, "the daemon's first commit everywhere")
        check_the_placement(roles)
        faults = []
        for role in KILLS:
            time.sleep(rng.uniform(0.3, 1.0))  # mid-run: windows open, transactions going
            faults.append(kill_and_bring_back(run, role))
        publishing.stop()
        publishing = None
        real_batches = finish(run, publisher, rng)
    finally:
        if publishing is not None:
            publishing.stop()
        if not run.exited():
            run.daemon.kill()
            run.daemon.wait(10)

    text = log.read_text()
    published = [t for _, t in publisher.published[:real_batches]]
    got, starts = output_frame(cluster.bootstrap, roles.sink)
    expected = reference(published, SIZE_MS)
    late_records = read_topic(cluster.bootstrap, roles.late, 1, quiet_s=2.0)
    hanging = {t: hanging_transactions(cluster.admin, t, 1) for t in (roles.sink, roles.late)}
    window_keys = ["window_start", *KEYS]
    lost = expected.join(got.select(window_keys), on=window_keys, how="anti",
                         nulls_equal=True).height
    write_figures("cluster_faults", {
        "cluster_start_s": round(cluster.start_s, 1), "faults": faults,
        "daemon_restarts": text.count("arrowagg consuming") - 1,
        "aborted_transactions": text.count("nothing committed"),
        "input_batches": real_batches, "input_rows": sum(t.num_rows for t in published),
        "windows": len(set(starts)), "output_rows": got.height,
        "duplicates": repeated_groups(got, KEYS), "lost": lost,
        "late_rows_published": len(late_records),
        "hanging_transactions": {t: h for t, h in hanging.items() if h},
        "test_wall_s": round(time.monotonic() - started, 1),
    })
    assert [f["role"] for f in faults] == list(KILLS)
    assert text.count("arrowagg consuming") == 1, "the daemon was restarted"
    assert text.count("stopped cleanly") == 1
    assert repeated_groups(got, KEYS) == 0, "a (window, keys) row was emitted twice"
    assert lost == 0
    assert late_records == [], "rows published during a failover were called late"
    assert_frame_equal(sorted_rows(got), expected, check_exact=False, rel_tol=1e-9,
                       abs_tol=1e-9, check_dtypes=False)
    assert hanging == {roles.sink: {}, roles.late: {}}, "a transaction was left open"
    assert int(got["row_count"].sum()) == sum(t.num_rows for t in published)
