"""The Quix Streams peer: the tumbling-window aggregation as a Quix user writes it.

Runs under its own interpreter (Quix Streams pins confluent-kafka below the version
arrowagg needs), so it imports nothing from arrowagg: pyarrow decodes each message, the
rows are expanded, re-keyed by (site, sensor) with ``group_by`` and aggregated per key
with ``tumbling_window().agg()``; ``final()`` emits a window once it closes. Prints one
JSON line: rows read, windows emitted, seconds from the first message to the last result.

    python bench/quix_app.py BOOTSTRAP INPUT_TOPIC EXPECTED_RESULTS WINDOW_MS TIMEOUT_S
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import uuid
from typing import Any

import pyarrow as pa
from pyarrow import ipc
from quixstreams import Application  # type: ignore[import-not-found,unused-ignore]
from quixstreams.dataframe.windows import (  # type: ignore[import-not-found,unused-ignore]
    Max,
    Min,
    Sum,
)


def main(bootstrap: str, topic_name: str, expected: int, window_ms: int,
         timeout_s: float) -> dict[str, Any]:
    seen = {"rows": 0, "results": 0, "first": 0.0, "last": 0.0}
    with tempfile.TemporaryDirectory() as state_dir:
        app = Application(broker_address=bootstrap, consumer_group=f"quix-{uuid.uuid4().hex}",
                          auto_offset_reset="earliest", state_dir=state_dir)

        def decode(value: bytes) -> list[dict[str, Any]]:
            if not seen["first"]:
                seen["first"] = time.perf_counter()
            table = ipc.open_stream(value).read_all()
            ts = table.schema.get_field_index("ts")
            table = table.set_column(ts, "ts", table.column(ts).cast(pa.int64()))
            seen["rows"] += table.num_rows
            rows: list[dict[str, Any]] = table.to_pylist()
            return rows

        def done(_window: dict[str, Any]) -> None:
            seen["results"] += 1
            seen["last"] = time.perf_counter()
            if seen["results"] >= expected:
                app.stop()

        sdf = app.dataframe(app.topic(topic_name, value_deserializer="bytes"))
        sdf = sdf.apply(decode, expand=True)
        sdf = sdf.set_timestamp(lambda row, _key, _ts, _headers: row["ts"])
        sdf = sdf.group_by(lambda row: f"{row['site']}|{row['sensor']}", name="site_sensor")
        sdf = sdf.tumbling_window(duration_ms=window_ms).agg(
            reading_sum=Sum("reading_sum"), reading_count=Sum("reading_count"),
            reading_min=Min("reading_min"), reading_max=Max("reading_max"),
            power=Sum("power"), error_count=Sum("error_count"),
        ).final(closing_strategy="partition")
        sdf = sdf.update(done)
        app.run(timeout=timeout_s)
    return {"rows": seen["rows"], "results": seen["results"],
            "seconds": seen["last"] - seen["first"] if seen["last"] else None}


if __name__ == "__main__":
    bootstrap, topic, expected, window, timeout = sys.argv[1:6]
    print(json.dumps(main(bootstrap, topic, int(expected), int(window), float(timeout))))
