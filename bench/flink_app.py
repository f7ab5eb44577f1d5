"""The Flink SQL peer: the tumbling-window aggregation as a Flink SQL user writes it.

Runs under its own interpreter (PyFlink in ``.venv/flink``, the Kafka SQL connector jar
in its ``jars/``) and imports nothing from arrowagg. A Kafka source table reads JSON, one
row a message, with ``ts`` (epoch ms) as event time and a watermark of the daemon's
lateness (none); the seed's aggregates (``power`` quoted: a reserved word) over the
``TUMBLE`` window table-valued function,
grouped by ``window_start, window_end, site, sensor``, go to a Kafka sink table as JSON.
Local execution (a MiniCluster in PyFlink's JVM), parallelism = cores, the default (heap)
state backend; exactly-once: a checkpoint a second and the transactional Kafka sink.

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

The job's rows never reach Python, so ``first_input`` is only printed with ``--probe``:
the source table alone, ``SELECT ts`` collected into Python, the first row's arrival
noted; the harness stops it there.

    python bench/flink_app.py BOOTSTRAP INPUT_TOPIC OUTPUT_TOPIC GROUP WINDOW_MS [--probe]
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from pyflink.table import (  # type: ignore[import-not-found,unused-ignore]
    EnvironmentSettings,
    TableEnvironment,
)

AGGREGATES = """SUM(reading_sum) AS reading_sum, SUM(reading_count) AS reading_count,
    MIN(reading_min) AS reading_min, MAX(reading_max) AS reading_max,
    SUM(`power`) AS `power`, SUM(error_count) AS error_count, COUNT(*) AS row_count"""


def settings(jars: Path) -> dict[str, str]:
    connector = next(jars.glob("flink-sql-connector-kafka-*.jar"))
    return {
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
        GROUP BY window_start, window_end, site, sensor"""


def main(bootstrap: str, source: str, output: str, group: str, window_ms: int, *,
         probe: bool) -> None:
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    config = env.get_config()
    for key, value in settings(Path(sys.prefix) / "jars").items():
        config.set(key, value)
    env.execute_sql(source_table(bootstrap, source, group))
    if probe:
        with env.execute_sql("SELECT ts FROM readings").collect() as rows:
            next(iter(rows))
            print(json.dumps({"first_input": time.time()}), flush=True)
            time.sleep(3600)  # the harness stops it
        return
    env.execute_sql(sink_table(bootstrap, output, group))
    env.execute_sql(windows_query(window_ms)).wait()


if __name__ == "__main__":
    bootstrap, source, output, group, window = sys.argv[1:6]
    main(bootstrap, source, output, group, int(window), probe="--probe" in sys.argv[6:])
