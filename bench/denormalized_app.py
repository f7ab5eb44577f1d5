"""The Denormalized peer: DataFusion over Kafka, as a Denormalized user writes the job.

Runs under its own interpreter (Denormalized needs Python 3.12+: ``.venv/denormalized``)
and imports nothing from arrowagg. ``from_topic`` reads JSON, one row a message, with
``ts`` as the event time; ``window`` groups 10-second tumbling windows by one key
(site|sensor concatenated: grouping by the two columns fails at planning in 0.0.13) and
``sink_kafka`` writes each result row as JSON. What it takes here:

- ``from_topic`` sets auto.offset.reset=latest: the harness commits offset 0 for GROUP
  first, so it reads the topic from the start;
- it is only correct on one core: on two, windows close early and extra one-row pieces
  are emitted. This runner pins itself to the first CPU it may use, before the engine
  starts its threads;
- it never stops by itself (the harness ends it; it exits 1 on SIGTERM).

Its input never reaches Python, so ``first_input`` is only printed with ``--probe``:
a scalar UDF on ``ts`` notes the first row. Messages become one-row batches, so the UDF
costs a Python call per row; the harness therefore times startup in a probe run and the
throughput in a run without it.

    python bench/denormalized_app.py BOOTSTRAP INPUT_TOPIC OUTPUT_TOPIC GROUP WINDOW_MS [--probe]
"""

from __future__ import annotations

import json
import os
import sys
import time

import pyarrow as pa
from denormalized import Context, col, lit, udf  # type: ignore[import-not-found,unused-ignore]
from denormalized.datafusion import (  # type: ignore[import-not-found,unused-ignore]
    functions as f,
)

SAMPLE = {"site": "site-00", "sensor": "sensor-00", "ts": 1_735_689_600_000,
          "reading_sum": 1.5, "reading_count": 1, "reading_min": 1.5, "reading_max": 1.5,
          "power": 1.5, "error_count": 0}


def main(bootstrap: str, source: str, output: str, group: str, window_ms: int, *,
         probe: bool) -> None:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    stream = Context().from_topic(source, json.dumps(SAMPLE), bootstrap, "ts", group_id=group)
    if probe:
        first: list[float] = []

        def seen(ts: pa.Array) -> pa.Array:
            if not first:
                first.append(time.time())
                print(json.dumps({"first_input": first[0]}), flush=True)
            return ts

        stream = stream.with_column("ts", udf(seen, [pa.int64()], pa.int64(), "volatile")(
            col("ts")))
    stream = stream.with_column("site_sensor", f.concat(col("site"), lit("|"), col("sensor")))
    stream = stream.window([col("site_sensor")], [
        f.sum(col("reading_sum")).alias("reading_sum"),
        f.sum(col("reading_count")).alias("reading_count"),
        f.min(col("reading_min")).alias("reading_min"),
        f.max(col("reading_max")).alias("reading_max"),
        f.sum(col("power")).alias("power"),
        f.sum(col("error_count")).alias("error_count"),
        f.count(col("ts")).alias("row_count"),
    ], window_ms, None)
    stream.sink_kafka(bootstrap, output)


if __name__ == "__main__":
    bootstrap, source, output, group, window = sys.argv[1:6]
    main(bootstrap, source, output, group, int(window), probe="--probe" in sys.argv[6:])
