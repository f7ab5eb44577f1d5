"""The scale-out through the real broker: 1, 2 and 3 daemon processes on one input.

The same pre-filled input topic (dictionary keys, 10,000 groups, 4 partitions, a
sentinel per partition closing every window) is drained by N identical instances with a
``scale_out`` section, from their launch until every part of every window has its
end-of-window marker on the output topic; and once by one instance without it, for the
price of the second stage. Two jobs: the seed's aggregates, which decompose (stage 1
sends partial states, O(groups x instances) a window), and the same with a median,
which does not (stage 1 also sends the median's column, O(rows)). Also measured: the
bytes that went through the repartition topic per GB of input.

On one machine the instances share its cores: what this shows is the cost of the two
stages and that the work splits, not a speed-up (docs/benchmarks.md has the figures and
what they say about N machines).

    python -m bench --sections scale_out
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from bench.broker import create_topic, delete_topics
from bench.e2e import Topic, prepare
from bench.payloads import WINDOW_MS
from bench.report import REPO

INPUT_PARTITIONS = 4
REPARTITIONS = 6
# The aggregation section of each job: the seed's default plan, and the same with a
# median of one column, whose values must all reach stage 2.
JOBS: dict[str, dict[str, Any]] = {"decomposable": {}, "holistic": {"columns": {"power": "median"}}}


def _config(path: Path, bootstrap: str, *, topic: str, output: str, group: str,
            instance: str, scale_out: dict[str, Any] | None, job: str,
            processing: dict[str, Any]) -> Path:
    data: dict[str, Any] = {
        "kafka": {"bootstrap_servers": bootstrap, "group_id": group},
        "input": {"topics": [topic]},
        "output": {"topic": output},
        "window": {"kind": "tumbling", "time": "event", "timestamp_column": "ts",
                   "size_ms": WINDOW_MS, "max_future_ms": None},
        "processing": {"instance_id": instance, **processing},
        "service": {"http_port": None, "statistics_interval_ms": 0},
        "logging": {"level": "WARNING"},
    }
    if JOBS[job]:
        data["aggregation"] = JOBS[job]
    if scale_out is not None:
        data["scale_out"] = scale_out
    path.write_text(yaml.safe_dump(data))
    return path


def _records(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, dict[str, bytes]]]:
    """(value size, headers) of every committed record of ``topic``, read to its end."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}",
                       "enable.auto.commit": False, "isolation.level": "read_committed",
                       "enable.partition.eof": True})
    reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    out: list[tuple[int, dict[str, bytes]]] = []
    at_end: set[int | None] = set()
    try:
        while len(at_end) < partitions:
            for message in reader.consume(1000, 0.5):
                if message.error() is not None:
                    at_end.add(message.partition())
                    continue
                raw = message.headers()
                pairs = raw.items() if isinstance(raw, dict) else raw or []
                out.append((len(message.value() or b""),
                            {k: v for k, v in pairs if isinstance(v, bytes)}))
    finally:
        reader.close()
    return out


def run(bootstrap: str, topic: Topic, instances: int, *, scale_out: bool,
        job: str = "decomposable", processing: dict[str, Any] | None = None,
        ) -> dict[str, Any]:
    """Launch ``instances`` daemons; wait until every window is whole on the output.
    ``processing``: settings of that section for every instance (the defaults if none)."""
    output = create_topic(bootstrap, "scale-out", 1)
    repartition = f"bench-rep-{uuid.uuid4().hex[:10]}"
    group = f"bench-{uuid.uuid4().hex[:10]}"
    section = {"repartition_topic": repartition, "partitions": REPARTITIONS} if scale_out \
        else None
    expected = topic.windows * (REPARTITIONS if scale_out else 1)
    with tempfile.TemporaryDirectory() as folder:
        launched = time.perf_counter()
        daemons = [subprocess.Popen(
            [sys.executable, "-m", "consumer", "run", "--config",
             str(_config(Path(folder) / f"{i}.yaml", bootstrap, topic=topic.name,
                         output=output, group=group, instance=f"bench-{i}",
                         scale_out=section, job=job, processing=processing or {}))],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for i in range(instances)]
        try:
            done = _wait_for_windows(bootstrap, output, expected, scale_out=scale_out,
                                     daemons=daemons)
        finally:
            for daemon in daemons:
                daemon.terminate()
            for daemon in daemons:
                daemon.wait(120)
    seconds = done - launched
    repartitioned = sum(size for size, _ in _records(bootstrap, repartition, REPARTITIONS)) \
        if scale_out else 0
    delete_topics(bootstrap, [output, *([repartition] if scale_out else [])])
    return {"job": job, "instances": instances,
            "mode": "two stages" if scale_out else "one instance",
            "seconds": seconds,
            "rows": topic.payloads.rows, "input_bytes": topic.nbytes,
            "rows_per_s": topic.payloads.rows / seconds,
            "repartition_bytes": repartitioned,
            "repartition_bytes_per_input_gb": repartitioned / topic.nbytes * 1e9}


def _wait_for_windows(bootstrap: str, output: str, expected: int, *, scale_out: bool,
                      daemons: list[subprocess.Popen[bytes]], timeout_s: float = 900,
                      ) -> float:
    """The moment the output holds ``expected`` end-of-window markers (scale-out) or
    final window messages (one instance)."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}",
                       "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                       "enable.auto.commit": False})
    reader.subscribe([output])
    seen, deadline = 0, time.monotonic() + timeout_s
    key = "arrowagg.end-of-window" if scale_out else "arrowagg.final"
    try:
        while seen < expected:
            if time.monotonic() > deadline or any(d.poll() is not None for d in daemons):
                raise RuntimeError(f"{seen} of {expected} windows complete; a daemon stopped "
                                   "or the time ran out")
            for message in reader.consume(500, 0.2):
                if message.error() is None:
                    raw = message.headers()
                    pairs = raw.items() if isinstance(raw, dict) else raw or []
                    seen += any(k == key and v == b"true" for k, v in pairs)
        return time.perf_counter()
    finally:
        reader.close()


def measure(bootstrap: str, *, target_bytes: int,
            step: Callable[[str], None] = lambda _what: None) -> dict[str, Any]:
    topic = prepare(bootstrap, "dictionary", target_bytes, INPUT_PARTITIONS,
                    messages_per_window=20)
    try:
        runs = []
        for job in JOBS:
            for instances, two_stages in ((1, False), (1, True), (2, True), (3, True)):
                step(f"scale-out, {job}: {instances} instance(s), "
                     f"{'two stages' if two_stages else 'one instance'}")
                runs.append(run(bootstrap, topic, instances, scale_out=two_stages, job=job))
    finally:
        delete_topics(bootstrap, [topic.name])
    return {"input_partitions": INPUT_PARTITIONS, "repartition_partitions": REPARTITIONS,
            "groups": 10_000, "windows": topic.windows, "rows": topic.payloads.rows,
            "input_bytes": topic.nbytes, "runs": runs}
