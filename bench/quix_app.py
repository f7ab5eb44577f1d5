"""The Quix Streams peer: the tumbling-window aggregation as a Quix user writes it.

Runs under its own interpreter (Quix Streams pins confluent-kafka below the version
arrowagg needs), so it imports nothing from arrowagg: pyarrow decodes each message, the
rows are expanded, re-keyed by (site, sensor) with ``group_by`` and aggregated per key
with ``tumbling_window().agg()``; ``final()`` emits a window once it closes, as JSON
to the output topic. Quix's default guarantee (at-least-once), one process. Prints one
JSON line, ``first_input``, when the first message reaches the pipeline; runs until
SIGTERM.

    python bench/quix_app.py BOOTSTRAP INPUT_TOPIC OUTPUT_TOPIC GROUP WINDOW_MS
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from typing import Any

import pyarrow as pa
from pyarrow import ipc
from quixstreams import Application  # type: ignore[import-not-found,unused-ignore]
from quixstreams.dataframe.windows import (  # type: ignore[import-not-found,unused-ignore]
    Count,
    Max,
    Min,
    Sum,
)


def main(bootstrap: str, source: str, output: str, group: str, window_ms: int) -> None:
    first: list[float] = []
    with tempfile.TemporaryDirectory() as state_dir:
        app = Application(broker_address=bootstrap, consumer_group=group,
                          auto_offset_reset="earliest", state_dir=state_dir)

        def decode(value: bytes) -> list[dict[str, Any]]:
            if not first:
                first.append(time.time())
                print(json.dumps({"first_input": first[0]}), flush=True)
            table = ipc.open_stream(value).read_all()
            ts = table.schema.get_field_index("ts")
            table = table.set_column(ts, "ts", table.column(ts).cast(pa.int64()))
            rows: list[dict[str, Any]] = table.to_pylist()
            return rows

        sdf = app.dataframe(app.topic(source, value_deserializer="bytes"))
        sdf = sdf.apply(decode, expand=True)
        sdf = sdf.set_timestamp(lambda row, _key, _ts, _headers: row["ts"])
        sdf = sdf.group_by(lambda row: f"{row['site']}|{row['sensor']}", name="site_sensor")
        sdf = sdf.tumbling_window(duration_ms=window_ms).agg(
            reading_sum=Sum("reading_sum"), reading_count=Sum("reading_count"),
            reading_min=Min("reading_min"), reading_max=Max("reading_max"),
            power=Sum("power"), error_count=Sum("error_count"), row_count=Count(),
        ).final(closing_strategy="partition")
        sdf.to_topic(app.topic(output, value_serializer="json", key_serializer="str"))
        app.run()


if __name__ == "__main__":
    bootstrap, source, output, group, window = sys.argv[1:6]
    main(bootstrap, source, output, group, int(window))
