"""Daemon processes of one consumer group, started, stopped, stalled and killed by a
test, and the checks of the output they wrote together (tests/integration/test_scale_out.py,
test_rebalance_storm.py)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import yaml
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._group import ConsumerGroupDescription
from polars.testing import assert_frame_equal

from consumer.kafka.tail import read_output
from tests.conftest import REPO, TopicFactory
from tests.integration.conftest import committed_offsets, end_offsets
from tests.integration.data import KEYS, T0, reference, sensor_table
from tests.integration.faults import (
    hanging_transactions,
    late_rows_logged,
    read_topic,
    wait_until,
)
from wire.output import WindowEnd, decode_message

INPUT_PARTITIONS = 4
REPARTITIONS = 6
WORKERS = 5
SIZE_MS = 400
STEP_MS = 50  # event time a worker's batch spans; 8 steps a window
STEPS = 200
SESSION = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000,
           "max.poll.interval.ms": 8000}
RUNNING_LINE = "arrowagg consuming"
# How long a fenced instance (a zombie's elder) may take to exit: it learns of the fence
# at its next transactional call, which can wait out its timeout (send_offsets 30 s,
# commit 60 s) while the coordinator completes the abort the fence began. Elders took
# 6-44 s on a burnt core (docs/reliability.md, "Zombies and their elders").
FENCED_EXIT_S = 150


def worker_batches(rng: random.Random) -> list[tuple[int, pa.Table]]:
    """Every worker writes its own partition (worker % 4), step by step in event time;
    each batch holds rows of many groups."""
    return [(worker % INPUT_PARTITIONS, sensor_table(rng, rng.randrange(20, 60),
                                                      T0 + step * STEP_MS, STEP_MS))
            for step in range(STEPS) for worker in range(WORKERS)]


class Instances:
    """The daemon processes of one consumer group, by name."""

    def __init__(self, tmp: Path, bootstrap: str, topics: dict[str, str], *,
                 repartitions: int | None = REPARTITIONS,
                 consumer: dict[str, Any] | None = None,
                 sections: dict[str, dict[str, Any]] | None = None) -> None:
        """``repartitions``: the scale-out's repartition partitions (None: no scale-out,
        each instance aggregates the input partitions it owns); ``sections``: merged into
        the configuration's sections (``window``, ``aggregation``, ...)."""
        self._tmp = tmp
        self._bootstrap = bootstrap
        self._topics = topics
        self._repartitions = repartitions
        self._sections = sections or {}
        self._consumer = {**SESSION, **(consumer or {})}
        self.running: dict[str, subprocess.Popen[bytes]] = {}
        self.exits: list[int] = []

    def log(self, name: str) -> Path:
        return self._tmp / f"{name}.log"

    def config(self, name: str, instance_id: str) -> Path:
        topics = self._topics
        data: dict[str, Any] = {
            "kafka": {"bootstrap_servers": self._bootstrap, "group_id": topics["group"],
                      "consumer": self._consumer},
            "input": {"topics": [topics["input"]]},
            "output": {"topic": topics["output"], "late_topic": topics["late"]},
            "window": {"kind": "tumbling", "time": "event", "timestamp_column": "ts",
                       "size_ms": SIZE_MS, "allowed_lateness_ms": SIZE_MS,
                       "idle_timeout_ms": 3000},
            "processing": {"instance_id": instance_id, "poll_timeout_ms": 100,
                           "commit_interval_ms": 300},
            "service": {"http_port": None, "statistics_interval_ms": 0},
        }
        if self._repartitions is not None:
            data["scale_out"] = {"repartition_topic": topics["repartition"],
                                 "partitions": self._repartitions}
        for section, values in self._sections.items():
            data[section] = {**data.get(section, {}), **values}
        path = self._tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    def start(self, name: str, instance_id: str | None = None) -> None:
        """Start a daemon and wait until it consumes; ``instance_id`` (default: ``name``)
        names its transactional.id and group.instance.id."""
        log = self.log(name)
        before = log.read_text().count(RUNNING_LINE) if log.exists() else 0
        process = self.launch(name, instance_id)
        wait_until(lambda: process.poll() is not None
                   or log.read_text().count(RUNNING_LINE) > before,
                   timeout_s=60, what=f"instance {name} to start")
        assert process.poll() is None, log.read_text()[-3000:]

    def launch(self, name: str, instance_id: str | None = None) -> subprocess.Popen[bytes]:
        """Start a daemon, without waiting; its output is appended to ``log(name)``."""
        env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
        with self.log(name).open("ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "consumer", "run", "--config",
                 str(self.config(name, instance_id or name))],
                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.running[name] = process
        return process

    def consuming(self, name: str) -> bool:
        return RUNNING_LINE in self.log(name).read_text()

    def stop(self, name: str, stop_signal: signal.Signals) -> None:
        process = self.running.pop(name)
        process.send_signal(stop_signal)
        self.exits.append(process.wait(60))

    def stop_all(self) -> None:
        for name in list(self.running):
            self.stop(name, signal.SIGTERM)

    def kill_all(self) -> None:
        for process in self.running.values():
            if process.poll() is None:
                process.kill()
                process.wait(10)


def end_markers(bootstrap: str, topic: str) -> int:
    return sum(1 for r in read_topic(bootstrap, topic, 2, quiet_s=1.0)
               if r.headers.get("arrowagg.end-of-window") == b"true")


def session_frontiers(bootstrap: str, topic: str) -> dict[bytes, int]:
    """Each part's furthest frontier marker on the output topic."""
    through: dict[bytes, int] = {}
    for record in read_topic(bootstrap, topic, 2, quiet_s=1.0):
        if (marker := record.headers.get("arrowagg.frontier")) is not None:
            part = record.headers["arrowagg.part"]
            through[part] = max(int(marker), through.get(part, int(marker)))
    return through


def make_topics(topic_factory: TopicFactory) -> dict[str, str]:
    name = f"{random.randrange(16**10):010x}"
    return {"input": topic_factory("in", partitions=INPUT_PARTITIONS),
            "output": topic_factory("out", partitions=2), "late": topic_factory("late"),
            "repartition": f"rep-{name}", "group": f"g-{name}"}


def wait_all_windows(bootstrap: str, topics: dict[str, str],
                     data: list[tuple[int, pa.Table]], *, parts: int = REPARTITIONS,
                     size_ms: int = SIZE_MS, step_ms: int | None = None) -> None:
    """Until stage 1 has committed the whole input and every part of every window sent
    has ended on the output topic (``step_ms``: hopping windows' step)."""
    step_ms = step_ms or size_ms
    wait_until(lambda: committed_offsets(bootstrap, topics["group"], topics["input"])
               == end_offsets(bootstrap, topics["input"]),
               timeout_s=120, what="every input record committed by stage 1")
    steps = pl.concat([pl.DataFrame(t) for _, t in data]).select(
        pl.col("ts").dt.epoch("ms") // step_ms).to_series()
    windows_sent = pl.concat([steps - k for k in range(size_ms // step_ms)]).n_unique()
    try:
        wait_until(lambda: end_markers(bootstrap, topics["output"]) >= windows_sent * parts,
                   timeout_s=120, what="every part of every window ended")
    except AssertionError as timed_out:
        raise AssertionError(f"{timed_out}: {markers_seen(bootstrap, topics['output'])}"
                             ) from timed_out


def markers_seen(bootstrap: str, topic: str) -> str:
    """What a reader sees of the end-of-window markers, and whether an open transaction
    holds the output back: the story a timed-out wait needs (it failed once in a soak
    run with every window logged as emitted, and said nothing more)."""
    seen = sorted((int(r.headers["arrowagg.window-start"]), r.headers["arrowagg.part"].decode())
                  for r in read_topic(bootstrap, topic, 2, quiet_s=3.0)
                  if r.headers.get("arrowagg.end-of-window") == b"true")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return (f"markers read_committed (window_start, part): {seen}; partitions whose last "
            f"stable offset is behind (gap): {hanging_transactions(admin, topic, 2)}")


def check_output(bootstrap: str, topics: dict[str, str], data: list[tuple[int, pa.Table]],
                 logs: list[Path], *, parts: int = REPARTITIONS,
                 late_allowed: bool = False) -> dict[str, Any]:
    """The output against DuckDB: figures, after the asserts that they are right."""

    messages = [decode_message(r.value, list(r.headers.items()))
                for r in read_topic(bootstrap, topics["output"], 2)]
    ends = [m for m in messages if isinstance(m, WindowEnd)]
    windows = list(read_output(bootstrap, topics["output"], idle_timeout_s=3.0, complete=True))
    got = pl.concat([w.frame for w in windows if w.frame.height]).with_columns(
        pl.col("window_start").dt.epoch("ms"), pl.col(KEYS).cast(pl.String))
    expected = reference([t for _, t in data], SIZE_MS)
    window_keys = ["window_start", *KEYS]
    duplicates = got.group_by(window_keys).len().filter(pl.col("len") > 1).height
    late = read_topic(bootstrap, topics["late"], 1, quiet_s=1.0)
    figures = {
        "input_rows": sum(t.num_rows for _, t in data),
        "output_rows": got.height, "reference_rows": expected.height,
        "windows": len(windows), "end_of_window_markers": len(ends),
        "duplicates": duplicates,
        "lost": expected.join(got.select(window_keys), on=window_keys, how="anti").height,
        "late_records": len(late), "late_rows_logged": late_rows_logged(*logs),
    }
    print(figures)
    print_mismatches(got, expected, window_keys)
    assert duplicates == 0, "a (window, keys) row was emitted twice"
    assert len(windows) == expected["window_start"].n_unique()
    assert len(ends) == len(windows) * parts, "every part of every window ended"
    if not late_allowed:
        assert figures["late_records"] == figures["late_rows_logged"] == 0
    assert_frame_equal(got.drop("window_end").select(expected.columns).sort(window_keys),
                       expected, check_exact=False, rel_tol=1e-9, abs_tol=1e-9,
                       check_dtypes=False)
    return figures


def print_mismatches(got: pl.DataFrame, expected: pl.DataFrame, on: list[str]) -> None:
    """The (window, keys) rows whose row count differs from the reference, with both
    counts: which windows a failure is about (a count too high is rows read twice)."""
    joined = expected.select(*on, "row_count").join(
        got.select(*on, "row_count"), on=on, how="left", suffix="_got")
    wrong = joined.filter(pl.col("row_count_got").is_null()
                          | (pl.col("row_count_got") != pl.col("row_count")))
    if wrong.height:
        with pl.Config(tbl_rows=40, tbl_cols=-1, tbl_width_chars=200):
            print(f"{wrong.height} (window, keys) rows differ from the reference:\n{wrong}")


def describe(admin: AdminClient, group: str) -> ConsumerGroupDescription | None:
    try:
        description: ConsumerGroupDescription = (
            admin.describe_consumer_groups([group])[group].result(timeout=10))
    except Exception:  # noqa: BLE001 - the group may not exist yet
        return None
    return description


def owners(admin: AdminClient, group: str, topic: str,
           partitions: int) -> dict[str, list[int]]:
    """Each member's instance id and partitions, once every partition has an owner
    (``{}`` while a rebalance is under way)."""
    description = describe(admin, group)
    if description is None:
        return {}
    owned = {
        member.group_instance_id or member.member_id: sorted(
            tp.partition for tp in member.assignment.topic_partitions if tp.topic == topic)
        for member in description.members
    }
    if sorted(p for parts in owned.values() for p in parts) != list(range(partitions)):
        return {}
    return owned
