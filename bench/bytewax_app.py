"""The Bytewax peer: the tumbling-window aggregation as a Bytewax user writes it.

Runs under its own interpreter (``bytewax[kafka]`` in ``.venv/bytewax``) and imports
nothing from arrowagg. ``kafka.operators.input`` reads the topic; each message becomes rows
(``arrow``: pyarrow decodes the IPC stream; ``json``: one object a message); ``key_on``
keys them by (site, sensor); ``fold_window`` sums, takes minima and maxima per key and
10-second window, unordered (the aggregates do not care), and each closed window goes to
the output topic as a JSON row. One worker (``cli_main``, the ``python -m bytewax.run``
path), no recovery configured: at-least-once at best.

The clock is event time only: ``EventClock`` with a constant ``now_getter``. Its default
adds the wall time elapsed since the highest timestamp to the watermark, which on a
replayed backlog closes windows while their rows are still arriving (15-28k rows of 2M
were dropped as late that way). Bytewax drops every row older than the watermark, and
keeps a clock per key: the watermark waits one window length (a message's rows are spread
over their window), and only a later row *of the same key* closes a key's windows, hence
the closing row per group. Prints ``first_input`` as a JSON line; runs until stopped.

    python bench/bytewax_app.py BOOTSTRAP INPUT_TOPIC OUTPUT_TOPIC arrow|json WINDOW_MS
"""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import bytewax.operators as op  # type: ignore[import-not-found,unused-ignore]
from bytewax.connectors.kafka import (  # type: ignore[import-not-found,unused-ignore]
    KafkaSinkMessage,
)
from bytewax.connectors.kafka import (  # type: ignore[import-not-found,unused-ignore]
    operators as kop,
)
from bytewax.dataflow import Dataflow  # type: ignore[import-not-found,unused-ignore]
from bytewax.operators import windowing as win  # type: ignore[import-not-found,unused-ignore]
from bytewax.run import cli_main  # type: ignore[import-not-found,unused-ignore]
from pyarrow import ipc

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SUMS = ("reading_sum", "reading_count", "power", "error_count")
# the accumulator: the four sums, reading_min, reading_max, row_count
SUM_SLOTS, MIN_SLOT, MAX_SLOT, COUNT_SLOT = range(4), 4, 5, 6


def flow(bootstrap: str, source: str, output: str, fmt: str, window_ms: int) -> Any:
    first: list[float] = []

    def decode(message: Any) -> list[dict[str, Any]]:
        if not first:
            first.append(time.time())
            print(json.dumps({"first_input": first[0]}), flush=True)
        if fmt == "json":
            row: dict[str, Any] = json.loads(message.value)
            row["ts"] = EPOCH + timedelta(milliseconds=row["ts"])
            return [row]
        rows: list[dict[str, Any]] = ipc.open_stream(message.value).read_all().to_pylist()
        return rows

    def fold(acc: list[Any], row: dict[str, Any]) -> list[Any]:
        for slot, name in zip(SUM_SLOTS, SUMS, strict=True):
            acc[slot] += row[name]
        acc[MIN_SLOT] = min(acc[MIN_SLOT], row["reading_min"])
        acc[MAX_SLOT] = max(acc[MAX_SLOT], row["reading_max"])
        acc[COUNT_SLOT] += 1
        return acc

    def merge(a: list[Any], b: list[Any]) -> list[Any]:
        return [*(x + y for x, y in zip(a[:4], b[:4], strict=True)), min(a[4], b[4]),
                max(a[5], b[5]), a[6] + b[6]]

    def encode(key_window: tuple[str, tuple[int, list[Any]]]) -> Any:
        key, (window_id, acc) = key_window
        site, sensor = key.split("|")
        start = window_id * window_ms
        row = {"window_start": start, "window_end": start + window_ms, "site": site,
               "sensor": sensor, **dict(zip(SUMS, acc[:4], strict=True)),
               "reading_min": acc[MIN_SLOT], "reading_max": acc[MAX_SLOT],
               "row_count": acc[COUNT_SLOT]}
        return KafkaSinkMessage(key.encode(), json.dumps(row).encode())

    dataflow = Dataflow("sensor_windows")
    messages = kop.input("in", dataflow, brokers=[bootstrap], topics=[source])
    rows = op.flat_map("decode", messages.oks, decode)
    keyed = op.key_on("key", rows, lambda row: f"{row['site']}|{row['sensor']}")
    clock = win.EventClock(lambda row: row["ts"], now_getter=lambda: EPOCH,
                           wait_for_system_duration=timedelta(milliseconds=window_ms))
    windower = win.TumblingWindower(length=timedelta(milliseconds=window_ms), align_to=EPOCH)
    windows = win.fold_window(
        "aggregate", keyed, clock, windower,
        builder=lambda: [0.0, 0, 0.0, 0, float("inf"), float("-inf"), 0],
        folder=fold, merger=merge, ordered=False)
    kop.output("out", op.map("encode", windows.down, encode), brokers=[bootstrap],
               topic=output)
    return dataflow


if __name__ == "__main__":
    bootstrap, source, output, fmt, window = sys.argv[1:6]
    cli_main(flow(bootstrap, source, output, fmt, int(window)), workers_per_process=1)
