"""The Flink SQL peer: the tumbling-window aggregation as a Flink SQL user writes it.

Runs under its own interpreter (PyFlink in ``.venv/flink``, the Kafka SQL connector jar
in its ``jars/``) and imports nothing from arrowagg. A Kafka source table reads JSON, one
row a message, with ``ts`` (epoch ms) as event time and a watermark of the daemon's
lateness (none); the seed's aggregates (``power`` quoted: a reserved word) over the
``TUMBLE`` window table-valued function,
grouped by ``window_start, window_end, site, sensor``, go to a Kafka sink table as JSON.
Local execution (a MiniCluster in PyFlink's JVM), parallelism = cores, the default (heap)
state backend; exactly-once: a checkpoint a second (to files in a temporary directory)
and the transactional Kafka sink.

Two settings make it right, each found wrong without it:

- the watermark is the highest event time less 1 ms: Flink's watermark ``t`` says no row
  at or before ``t`` is to come, so ``AS event_time`` (no delay) closes a window at the
  first row of its last millisecond, and the window's rows after it are dropped as late
  (10-30% of every window here, the rows of a window coming in no order of time). Less
  1 ms, a window closes at the first row past its end, as the daemon's do with
  ``allowed_lateness_ms`` 0;
- the source reads with as many subtasks as the topic has partitions (one), the rest of
  the job with one a core: a source subtask without a partition holds every window back
  (no result in 200 s), and the alternative, ``table.exec.source.idle-timeout``, would
  also declare a slow partition idle and drop its rows.

The job's rows never reach Python, so ``first_input`` comes from the job's own metrics:
a thread asks the local cluster's REST server (on a free port) until the source vertex
has written a record (within ~0.15 s of it), prints the time and stops asking. Runs until
SIGTERM.

    python bench/flink_app.py BOOTSTRAP INPUT_TOPIC OUTPUT_TOPIC GROUP WINDOW_MS
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from pyflink.table import (  # type: ignore[import-not-found,unused-ignore]
    EnvironmentSettings,
    TableEnvironment,
)

AGGREGATES = """SUM(reading_sum) AS reading_sum, SUM(reading_count) AS reading_count,
    MIN(reading_min) AS reading_min, MAX(reading_max) AS reading_max,
    SUM(`power`) AS `power`, SUM(error_count) AS error_count, COUNT(*) AS row_count"""


def settings(jars: Path, rest_port: int, checkpoints: Path) -> dict[str, str]:
    connector = next(jars.glob("flink-sql-connector-kafka-*.jar"))
    return {
        # Checkpoints to files, as for any real state: the default (the JobManager's
        # memory) takes at most 5 MB, and at 1M groups every checkpoint failed, the job
        # restarting in a loop and never closing a window.
        "execution.checkpointing.dir": checkpoints.as_uri(),
        "rest.port": str(rest_port),
        "metrics.fetcher.update-interval": "100 ms",
        "parallelism.default": str(os.cpu_count() or 1),
        "pipeline.jars": connector.as_uri(),
        "table.local-time-zone": "UTC",
        "execution.checkpointing.interval": "1 s",
        "execution.checkpointing.mode": "EXACTLY_ONCE",
    }


def source_table(bootstrap: str, topic: str, group: str) -> str:
    """The input: the harness gives every peer a topic of one partition."""
    return f"""CREATE TABLE readings (
        site STRING, sensor STRING, ts BIGINT, reading_sum DOUBLE, reading_count BIGINT,
        reading_min DOUBLE, reading_max DOUBLE, `power` DOUBLE, error_count BIGINT,
        event_time AS TO_TIMESTAMP_LTZ(ts, 3),
        WATERMARK FOR event_time AS event_time - INTERVAL '0.001' SECOND
    ) WITH (
        'connector' = 'kafka', 'topic' = '{topic}',
        'properties.bootstrap.servers' = '{bootstrap}', 'properties.group.id' = '{group}',
        'scan.startup.mode' = 'earliest-offset', 'format' = 'json',
        'scan.parallelism' = '1'
    )"""


def sink_table(bootstrap: str, topic: str, group: str) -> str:
    return f"""CREATE TABLE results (
        window_start TIMESTAMP(3), window_end TIMESTAMP(3), site STRING, sensor STRING,
        reading_sum DOUBLE, reading_count BIGINT, reading_min DOUBLE, reading_max DOUBLE,
        `power` DOUBLE, error_count BIGINT, row_count BIGINT
    ) WITH (
        'connector' = 'kafka', 'topic' = '{topic}',
        'properties.bootstrap.servers' = '{bootstrap}', 'format' = 'json',
        'sink.delivery-guarantee' = 'exactly-once',
        'sink.transactional-id-prefix' = '{group}',
        'properties.transaction.timeout.ms' = '60000'
    )"""


def windows_query(window_ms: int) -> str:
    return f"""INSERT INTO results
        SELECT window_start, window_end, site, sensor, {AGGREGATES}
        FROM TABLE(TUMBLE(TABLE readings, DESCRIPTOR(event_time),
                          INTERVAL '{window_ms / 1000:g}' SECOND))
        GROUP BY window_start, window_end, site, sensor"""  # noqa: S608 - no input in it


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def rest(port: int, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
        found: dict[str, Any] = json.load(answer)
        return found


def note_first_input(port: int) -> None:
    """Print the time the source first hands rows on, read from the job's metrics (every
    50 ms, the REST server's copy refreshed every 100 ms), then stop asking."""
    while True:
        try:
            for job in rest(port, "/jobs/overview")["jobs"]:
                for vertex in rest(port, f"/jobs/{job['jid']}")["vertices"]:
                    if (vertex["name"].startswith("Source:")
                            and vertex["metrics"].get("write-records", 0) > 0):
                        print(json.dumps({"first_input": time.time()}), flush=True)
                        return
        except (OSError, KeyError, ValueError):
            pass  # the cluster or the job is not up yet
        time.sleep(0.05)


def main(bootstrap: str, source: str, output: str, group: str, window_ms: int) -> None:
    port = free_port()
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    config = env.get_config()
    checkpoints = Path(tempfile.mkdtemp(prefix="flink-peer-"))
    for key, value in settings(Path(sys.prefix) / "jars", port, checkpoints).items():
        config.set(key, value)
    env.execute_sql(source_table(bootstrap, source, group))
    env.execute_sql(sink_table(bootstrap, output, group))
    threading.Thread(target=note_first_input, args=(port,), daemon=True).start()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
    try:
        env.execute_sql(windows_query(window_ms)).wait()
    finally:  # the checkpoints of a million groups are tens of MB
        shutil.rmtree(checkpoints, ignore_errors=True)


if __name__ == "__main__":
    bootstrap, source, output, group, window = sys.argv[1:6]
    main(bootstrap, source, output, group, int(window))
