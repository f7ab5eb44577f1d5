"""What ``tail`` prints, without a broker: every time in ``--format json`` is RFC 3339
UTC (headers, rows, dead letters), and the table view keeps its bounds and shows as many
rows as asked (tests/integration/test_cli.py reads late records through a broker)."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime

import polars as pl

from consumer.kafka.tail import DeadLetter, Record
from consumer.kafka.tail_views import DEFAULT_ROWS, dead_letter_json, print_window, window_json
from tests.wire.helpers import RFC3339_UTC
from wire.output import OutputWindow

START_MS = 1_735_689_600_000  # 2025-01-01T00:00:00Z


def window(frame: pl.DataFrame, **fields: object) -> OutputWindow:
    base: dict[str, object] = {"start_ms": START_MS, "end_ms": START_MS + 5_000,
                               "final": True, "revision": 0, "window_rows": 3,
                               "chunk": (1, 1), "frame": frame}
    return OutputWindow(**{**base, **fields})  # type: ignore[arg-type]


def result_rows() -> pl.DataFrame:
    return pl.DataFrame({
        "window_start": [START_MS], "window_end": [START_MS + 5_000], "site": ["a"],
        "seen": [datetime(2025, 1, 1, 0, 0, 1, 250_000)], "reading": [1.5], "row_count": [3],
    }).with_columns(pl.col("window_start", "window_end").cast(pl.Datetime("ms", "UTC")),
                    pl.col("seen").cast(pl.Datetime("us", "Europe/Paris")))


def times_in(document: object) -> list[str]:
    """Every string value that looks like a date and time, anywhere in ``document``."""
    if isinstance(document, dict):
        return [t for value in document.values() for t in times_in(value)]
    if isinstance(document, list):
        return [t for value in document for t in times_in(value)]
    return [document] if isinstance(document, str) and document[:4].isdigit() else []


def test_window_json_writes_every_time_as_rfc3339_utc() -> None:
    document = json.loads(window_json(window(result_rows())))
    [row] = document["rows"]
    assert document["window_start"] == row["window_start"] == "2025-01-01T00:00:00.000Z"
    assert document["window_end"] == row["window_end"] == "2025-01-01T00:00:05.000Z"
    assert row["seen"] == "2025-01-01T00:00:01.250000Z"  # Paris 01:00:01.25 in UTC
    assert all(RFC3339_UTC.match(t) for t in times_in(document))


def test_dead_letter_json_writes_its_time_as_rfc3339_utc() -> None:
    record = Record("dlq", 0, 4, START_MS, None, b"x", [])
    letter = DeadLetter(record, "in[1]@7", START_MS + 1, "not-arrow-ipc", "bad", "g", "0.1.0")
    document = json.loads(dead_letter_json(letter))
    assert document["origin_timestamp"] == "2025-01-01T00:00:00.001Z"
    assert datetime.fromisoformat(document["origin_timestamp"]) == datetime(
        2025, 1, 1, 0, 0, 0, 1000, tzinfo=UTC)


def test_a_table_shows_twenty_rows_unless_asked_for_more() -> None:
    frame = pl.concat([result_rows().with_columns(pl.lit(f"site-{i:02d}").alias("site"))
                       for i in range(30)])
    shown = {}
    for rows in (DEFAULT_ROWS, None):
        out = io.StringIO()
        print_window(window(frame), out, max_rows=rows)
        shown[rows] = out.getvalue()
    assert "site-29" in shown[None]
    assert "site-15" in shown[None]
    assert "site-15" not in shown[DEFAULT_ROWS]  # the middle is elided
    assert "window_start" in shown[DEFAULT_ROWS], "the bounds stay in the table"
