"""The two-stage scale-out through Apache Kafka, where the instances and partitions
change shape: more instances than input partitions, and a partition added while running.
And the README's example as written: three identical instances on one host, each on
an HTTP port of its own. (Instances coming and going, SIGKILLs, a stalled instance and a
zombie, in every window kind and late policy: test_scale_out_matrix.py.)"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
import yaml
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewPartitions

from tests.conftest import REPO, TopicFactory
from tests.consumer.service.probes import free_port_range
from tests.integration.conftest import committed_offsets, end_offsets
from tests.integration.data import T0, sensor_table
from tests.integration.faults import (
    DurablePublisher,
    PacedPublishing,
    Record,
    read_topic,
    wait_until,
    write_figures,
)
from tests.integration.instances import (
    INPUT_PARTITIONS,
    REPARTITIONS,
    RUNNING_LINE,
    SESSION,
    SIZE_MS,
    STEP_MS,
    Instances,
    check_output,
    make_topics,
    owners,
    wait_all_windows,
)
from wire.input import decode_ipc_stream
from wire.repartition import HEADER_KIND, KIND_PROGRESS, decode_progress

pytestmark = [pytest.mark.integration, pytest.mark.slow]

def test_more_instances_than_input_partitions_and_a_partition_added_while_running(
    bootstrap: str, admin: AdminClient, topic_factory: TopicFactory, tmp_path: Path,
) -> None:
    """Three instances on two input partitions (one of them runs stage 2 only); then a
    third input partition appears while running. Once stage 2 has heard of it, its rows
    of windows still open are aggregated like any; its rows of a window already emitted
    are late, never merged."""
    topics = {**make_topics(topic_factory), "input": topic_factory("in", partitions=2)}
    # A partition added to the topic is seen at the next metadata refresh (5 min by
    # default: operators who add partitions may want it shorter, as here).
    instances = Instances(tmp_path, bootstrap, topics, repartitions=2,
                          consumer={"topic.metadata.refresh.interval.ms": 2000})
    rng = random.Random(16)
    first = steps(rng, range(2), range(40))  # windows 0-4, partitions 0 and 1
    old = [(2, sensor_table(rng, 25, T0 + SIZE_MS, SIZE_MS))]  # window 1, emitted long ago
    then = steps(rng, range(3), range(40, 80))  # all three partitions: windows 5-9
    publisher = DurablePublisher(bootstrap, topics["input"])
    group, source = topics["group"], topics["input"]
    try:
        for name in ("a", "b", "c"):
            instances.start(name)
        wait_until(lambda: len(owners(admin, group, source, 2)) == 3, timeout_s=60,
                   what="three members sharing the two input partitions")
        layout = owners(admin, group, source, 2)
        assert [] in layout.values(), f"one instance runs stage 2 only: {layout}"
        publish(publisher, first)
        wait_until(lambda: committed_offsets(bootstrap, group, source)
                   == end_offsets(bootstrap, source), timeout_s=90,
                   what="the first windows through stage 1")
        admin.create_partitions([NewPartitions(source, 3)])[source].result(timeout=30)
        # A producer made now knows the new partition (an older one's metadata may not).
        publisher = DurablePublisher(bootstrap, source, producer_id="after")
        publish(publisher, old)
        # From its owner's first progress record on, stage 2 waits for the new partition.
        wait_until(lambda: committed_offsets(bootstrap, group, source)
                   == end_offsets(bootstrap, source)
                   and named_in_progress(bootstrap, topics["repartition"], (source, 2)),
                   timeout_s=60, what="the new partition read and named in a progress record")
        # Paced, as live producers are: every partition is idle by now, and a partition
        # stays idle (holding nothing back) until its next rows are read; paced, they are
        # read long before any of them could move a frontier past a window still open.
        PacedPublishing(publisher, then, pause_s=0.05).finish()
        publisher.flush()
        wait_all_windows(bootstrap, topics, [*first, *then], parts=2)
        instances.stop_all()
    finally:
        instances.kill_all()
    late_records = read_topic(bootstrap, topics["late"], 1, quiet_s=1.0)
    late_rows = sum(late_row_count(r) for r in late_records)
    figures = check_output(bootstrap, topics, [*first, *then],
                           [instances.log(n) for n in ("a", "b", "c")], parts=2,
                           late_allowed=True)
    write_figures("scale_out_partitions", {"layout_before": layout, **figures,
                                           "late_rows_in_late_topic": late_rows})
    assert late_rows == old[0][1].num_rows, "the old window's rows, late, and only they"


def named_in_progress(bootstrap: str, repartition_topic: str,
                      partition: tuple[str, int]) -> bool:
    """Whether a progress record names that input partition. Progress goes to every
    repartition partition: reading the first is enough."""
    return any((p.topic, p.partition) == partition
               for r in read_topic(bootstrap, repartition_topic, 1, quiet_s=1.0)
               if r.headers.get(HEADER_KIND) == KIND_PROGRESS.encode()
               for p in decode_progress(r.value).partitions)


def steps(rng: random.Random, partitions: range, window_steps: range,
          ) -> list[tuple[int, pa.Table]]:
    return [(p, sensor_table(rng, 30, T0 + step * STEP_MS, STEP_MS))
            for step in window_steps for p in partitions]


def publish(publisher: DurablePublisher, batches: list[tuple[int, pa.Table]]) -> None:
    for partition, table in batches:
        publisher.publish(partition, table)
    publisher.flush()


def late_row_count(record: Record) -> int:
    """Input rows a late record stands for: raw late rows (stage 1 found them late), or
    the row_count of finalized aggregates (stage 2 did)."""
    table = pl.DataFrame(decode_ipc_stream(record.value))
    if record.headers.get("arrowagg.late.kind") == b"aggregate":
        return int(table["row_count"].sum())
    return table.height


def started(process: subprocess.Popen[bytes], log: Path) -> bool:
    """Running, or gone: either way, no longer starting."""
    return process.poll() is not None or RUNNING_LINE in log.read_text()


def test_the_readme_example_runs_three_identical_instances_on_one_host(
    bootstrap: str, topic_factory: TopicFactory, tmp_path: Path,
) -> None:
    """README, "Several instances": three identical commands on one machine, each with its
    instance id only. Each takes its own HTTP port from the range (the default is
    9464-9474; this test takes free ports), logs it and writes it where
    `python -m consumer.healthcheck --config` finds it; the output is exact."""
    topics = make_topics(topic_factory)
    config = tmp_path / "config.yaml"  # one file for all three
    config.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": bootstrap, "group_id": topics["group"],
                  "consumer": SESSION},
        "input": {"topics": [topics["input"]]},
        "output": {"topic": topics["output"], "late_topic": topics["late"]},
        "window": {"kind": "tumbling", "time": "event", "timestamp_column": "ts",
                   "size_ms": SIZE_MS, "allowed_lateness_ms": SIZE_MS, "idle_timeout_ms": 3000},
        "processing": {"poll_timeout_ms": 100, "commit_interval_ms": 300},
        "scale_out": {"repartition_topic": topics["repartition"], "partitions": REPARTITIONS},
        "service": {"statistics_interval_ms": 0},
    }))
    low, high = free_port_range(11)
    shell = {k: v for k, v in os.environ.items()
             if not k.startswith("ARROWAGG_") and k not in {"KAFKA_BOOTSTRAP_SERVERS",
                                                            "RUNTIME_DIRECTORY"}}
    shell |= {"ARROWAGG_SERVICE__HTTP_PORT": f"{low}-{high}",
              "XDG_RUNTIME_DIR": str(tmp_path / "run")}
    running: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name in ("a", "b", "c"):
            env = {**shell, "ARROWAGG_PROCESSING__INSTANCE_ID": name}
            with (tmp_path / f"{name}.log").open("wb") as out:
                running[name] = subprocess.Popen(
                    [sys.executable, "-m", "consumer", "run", "--config", str(config)],
                    cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        for name, process in running.items():
            log = tmp_path / f"{name}.log"
            wait_until(partial(started, process, log), timeout_s=60, what=f"{name} to run")
            assert process.poll() is None, log.read_text()[-3000:]
        files = sorted((tmp_path / "run" / "arrowagg").glob("*.port"))
        ports = sorted(int(f.read_text().split()[1]) for f in files)
        assert len(set(ports)) == 3, "each instance took a port of its own"
        assert all(low <= port <= high for port in ports)
        for name in running:
            env = {**shell, "ARROWAGG_PROCESSING__INSTANCE_ID": name}
            check = subprocess.run(
                [sys.executable, "-m", "consumer.healthcheck", "--config", str(config)],
                cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False)
            assert (check.returncode, check.stderr) == (0, ""), name
        data = steps(random.Random(35), range(INPUT_PARTITIONS), range(24))
        publish(DurablePublisher(bootstrap, topics["input"]), data)
        wait_all_windows(bootstrap, topics, data)
        for process in running.values():
            process.send_signal(signal.SIGTERM)
        assert [process.wait(60) for process in running.values()] == [0, 0, 0]
    finally:
        for process in running.values():
            if process.poll() is None:
                process.kill()
                process.wait(10)
    assert list((tmp_path / "run" / "arrowagg").glob("*.port")) == [], "removed on stop"
    check_output(bootstrap, topics, data, [tmp_path / f"{n}.log" for n in running])
