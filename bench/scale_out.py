"""The scale-out through the real broker: 1, 2 and 3 daemon processes on one input.

The same pre-filled input topic (dictionary keys, 10,000 groups, 4 partitions, a
sentinel per partition closing every window) is drained by N identical instances with a
``scale_out`` section, from their launch until every part of every window has its
end-of-window marker on the output topic; and once by one instance without it, for the
price of the second stage. Two jobs over 10 s tumbling windows: the seed's aggregates,
which decompose (stage 1 sends partial states, O(groups x instances) a window), and the
same with a median, which does not (stage 1 also sends the median's column, O(rows)).
The same two over session windows (a 1 s gap: each group has a row every ~400 ms of
event time, so its sessions last seconds and cross the 10 s windows): stage 1 sends
partial sessions, stage 2 merges them. Session output has no shared window bounds, so
those runs end when the output holds every session of the data, counted beforehand from
the published messages by Polars (``sessions_in``), not by the daemon. Also measured:
the bytes that went through the repartition topic per GB of input.

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

import polars as pl
import yaml
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from pyarrow import ipc

from bench.broker import create_topic, delete_topics
from bench.e2e import Topic, prepare
from bench.payloads import START_MS, WINDOW_MS
from bench.report import REPO
from wire.output import OutputWindow, decode_message

INPUT_PARTITIONS = 4
REPARTITIONS = 6
SESSION_GAP_MS = 1_000
TUMBLING: dict[str, Any] = {"kind": "tumbling", "size_ms": WINDOW_MS}
# A message spans its whole 10 s window, so rows are in order only window by window: an
# allowed lateness of one window keeps every row in its session (as in
# bench/research/sessions.py).
SESSION: dict[str, Any] = {"kind": "session", "gap_ms": SESSION_GAP_MS,
                           "allowed_lateness_ms": WINDOW_MS}
MEDIAN: dict[str, Any] = {"columns": {"power": "median"}}
# Each job's window section and aggregation section: the seed's default plan, and the
# same with a median of one column, whose values must all reach stage 2; over tumbling
# windows, then over sessions.
JOBS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "decomposable": (TUMBLING, {}), "holistic": (TUMBLING, MEDIAN),
    "session": (SESSION, {}), "session holistic": (SESSION, MEDIAN)}
KEYS = ("site", "sensor")  # what the seed's plan derives from the schema


def _config(path: Path, bootstrap: str, *, topic: str, output: str, group: str,
            instance: str, scale_out: dict[str, Any] | None, job: str,
            processing: dict[str, Any]) -> Path:
    data: dict[str, Any] = {
        "kafka": {"bootstrap_servers": bootstrap, "group_id": group},
        "input": {"topics": [topic]},
        "output": {"topic": output},
        "window": {**JOBS[job][0], "time": "event", "timestamp_column": "ts",
                   "max_future_ms": None},
        "processing": {"instance_id": instance, **processing},
        "service": {"http_port": None, "statistics_interval_ms": 0},
        "logging": {"level": "WARNING"},
    }
    if JOBS[job][1]:
        data["aggregation"] = JOBS[job][1]
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


def sessions_in(values: list[bytes], gap_ms: int = SESSION_GAP_MS) -> int:
    """How many sessions the rows of ``values`` (input messages) form: per group, one
    and one more at every row ``gap_ms`` or more after the one before it. Reckoned here
    with Polars over the published data, so a session run's end does not depend on the
    daemon counting right."""
    frames = [pl.from_arrow(ipc.open_stream(value).read_all().select([*KEYS, "ts"]))
              for value in values]
    rows = pl.concat([f for f in frames if isinstance(f, pl.DataFrame)]).with_columns(
        pl.col(*KEYS).cast(pl.String), pl.col("ts").dt.epoch("ms"))
    per_group = rows.group_by(*KEYS).agg(
        ((pl.col("ts").sort().diff() >= gap_ms).sum() + 1).alias("sessions"))
    return int(per_group.get_column("sessions").sum())


def run(bootstrap: str, topic: Topic, instances: int, *, scale_out: bool,
        job: str = "decomposable", processing: dict[str, Any] | None = None,
        sessions: int | None = None) -> dict[str, Any]:
    """Launch ``instances`` daemons; wait until every window (every session: the
    session jobs) is whole on the output. ``processing``: settings of that section for
    every instance (the defaults if none). ``sessions``: ``sessions_in`` of the topic's
    data (reckoned here if None and the job has sessions)."""
    output = create_topic(bootstrap, "scale-out", 1)
    repartition = f"bench-rep-{uuid.uuid4().hex[:10]}"
    group = f"bench-{uuid.uuid4().hex[:10]}"
    section = {"repartition_topic": repartition, "partitions": REPARTITIONS} if scale_out \
        else None
    session = JOBS[job][0]["kind"] == "session"
    if session:
        expected = sessions if sessions is not None else sessions_in(topic.payloads.values)
        # The sentinels' own session (an idle timeout may close it) is no session of the
        # data: only those starting before the first data window past the last count.
        count = sessions_before(START_MS + topic.windows * WINDOW_MS)
    else:
        expected = topic.windows * (REPARTITIONS if scale_out else 1)
        count = window_ends(scale_out=scale_out)
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
            done = wait_for_output(bootstrap, output, expected, count, daemons=daemons)
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
            **({"sessions": expected} if session else {}),
            "seconds": seconds,
            "rows": topic.payloads.rows, "input_bytes": topic.nbytes,
            "rows_per_s": topic.payloads.rows / seconds,
            "repartition_bytes": repartitioned,
            "repartition_bytes_per_input_gb": repartitioned / topic.nbytes * 1e9}


Headers = list[tuple[str, bytes]]
# What one output message adds to the count a run waits for.
Count = Callable[[bytes | None, Headers], int]


def window_ends(*, scale_out: bool) -> Count:
    """Counts end-of-window markers (scale-out) or final window messages (one instance)."""
    key = "arrowagg.end-of-window" if scale_out else "arrowagg.final"
    return lambda _value, headers: any(k == key and v == b"true" for k, v in headers)


def sessions_before(end_ms: int) -> Count:
    """Counts the sessions starting before ``end_ms`` in session output (closing
    revisions only: provisional ones would count a session twice)."""
    def count(value: bytes | None, headers: Headers) -> int:
        if not any(k == "arrowagg.window-kind" for k, _ in headers):
            return 0
        message = decode_message(value, headers)
        if not isinstance(message, OutputWindow) or not message.final:
            return 0  # a frontier marker, or a provisional session
        starts = message.frame.get_column("window_start").dt.epoch("ms")
        return int((starts < end_ms).sum())
    return count


def wait_for_output(bootstrap: str, output: str, expected: int, count: Count, *,
                     daemons: list[subprocess.Popen[bytes]], timeout_s: float = 900,
                     ) -> float:
    """The moment the output's messages have ``count``ed up to ``expected``."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}",
                       "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                       "enable.auto.commit": False})
    reader.subscribe([output])
    seen, deadline = 0, time.monotonic() + timeout_s
    try:
        while seen < expected:
            if time.monotonic() > deadline or any(d.poll() is not None for d in daemons):
                raise RuntimeError(f"{seen} of {expected} windows (sessions) complete; a "
                                   "daemon stopped or the time ran out")
            for message in reader.consume(500, 0.2):
                if message.error() is None:
                    raw = message.headers()
                    pairs = raw.items() if isinstance(raw, dict) else raw or []
                    seen += count(message.value(),
                                  [(k, v) for k, v in pairs if isinstance(v, bytes)])
        if seen > expected:
            raise RuntimeError(f"{seen} windows (sessions) on the output, {expected} expected")
        return time.perf_counter()
    finally:
        reader.close()


def measure(bootstrap: str, *, target_bytes: int,
            runs_of: tuple[tuple[int, bool], ...] = ((1, False), (1, True), (2, True),
                                                     (3, True)),
            repeats: int = 1,
            step: Callable[[str], None] = lambda _what: None) -> dict[str, Any]:
    """Each job through ``runs_of``: (instances, two stages), one instance first. The
    runs of one instance (without and with the two stages) are repeated ``repeats``
    times, interleaved, so the price of the second stage is a ratio of medians: one
    instance's runs of the same commit swing by 2x on a two-core machine."""
    topic = prepare(bootstrap, "dictionary", target_bytes, INPUT_PARTITIONS,
                    messages_per_window=20)
    try:
        sessions = sessions_in(topic.payloads.values)
        runs = []
        for job in JOBS:
            for repeat in range(repeats):
                for instances, two_stages in runs_of:
                    if repeat and instances > 1:
                        continue
                    step(f"scale-out, {job}: {instances} instance(s), "
                         f"{'two stages' if two_stages else 'one instance'}"
                         + (f" (run {repeat + 1} of {repeats})" if instances == 1 < repeats
                            else ""))
                    runs.append(run(bootstrap, topic, instances, scale_out=two_stages,
                                    job=job, sessions=sessions))
    finally:
        delete_topics(bootstrap, [topic.name])
    return {"input_partitions": INPUT_PARTITIONS, "repartition_partitions": REPARTITIONS,
            "groups": 10_000, "windows": topic.windows, "rows": topic.payloads.rows,
            "input_bytes": topic.nbytes, "session_gap_ms": SESSION_GAP_MS,
            "sessions": sessions, "runs": runs}
