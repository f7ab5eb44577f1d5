"""How ``python -m consumer tail`` shows what it reads (consumer/kafka/tail.py): a table
per message for a terminal, or one JSON object a line for jq. Every time in JSON is RFC
3339 in UTC (wire/timestamps.py); the tables keep every column, window bounds included.
"""

from __future__ import annotations

import json
import math
from datetime import date, datetime, timedelta
from typing import TextIO

import polars as pl

from consumer.kafka.tail import DeadLetter, LateRecord
from wire.output import OutputWindow
from wire.timestamps import rfc3339_columns, rfc3339_datetime, rfc3339_ms

DEFAULT_ROWS = 20  # rows of a table shown before the rest are elided

_KIND_WORDS = {"full": "the whole window", "delta": "rows since the last revision, to add",
               "update": "changed groups, replacing theirs"}
_SESSION_KIND_WORDS = {**_KIND_WORDS, "full": "whole sessions",
                       "update": "whole sessions, replacing those they name"}


def print_window(window: OutputWindow, out: TextIO, *, max_rows: int | None = DEFAULT_ROWS,
                 ) -> None:
    """A header line (bounds, chunk, groups or sessions, input rows, final or not,
    revision, sessions replaced) and the results as a table of at most ``max_rows`` rows
    (None: all)."""
    words = _SESSION_KIND_WORDS if window.sessions else _KIND_WORDS
    revision = "" if window.revision == 0 and window.kind == "full" else (
        f", revision {window.revision} ({words[window.kind]})")
    what = "sessions" if window.sessions else "groups"
    replaced = "" if window.replaced is None or window.replaced.height == 0 else (
        f"; replacing {window.replaced.height} held session rows")
    out.write(f"{'sessions' if window.sessions else 'window'} "
              f"{_bounds(window.start_ms, window.end_ms)}{_chunk(window.chunk)}: "
              f"{window.frame.height} {what}, {window.window_rows} input rows, "
              f"{'final' if window.final else 'partial'}{revision}{replaced}\n")
    _table(window.frame, out, max_rows)


def window_json(window: OutputWindow) -> str:
    """One line of JSON for a window: its bounds, flags and every result row."""
    document: dict[str, object] = {
        "window_start": rfc3339_ms(window.start_ms), "window_end": rfc3339_ms(window.end_ms),
        "final": window.final, "revision": window.revision, "kind": window.kind,
        "input_rows": window.window_rows, "chunk": list(window.chunk),
        "rows": _rows(window.frame)}
    if window.sessions:
        document["sessions"] = True
    if window.replaced is not None:
        document["replaced"] = _rows(window.replaced)
    return _json(document)


def print_dead_letter(letter: DeadLetter, out: TextIO) -> None:
    stamp = letter.origin_timestamp_ms
    out.write(f"{letter.origin} ({None if stamp is None else rfc3339_ms(stamp)}): "
              f"{letter.reason}: {letter.message} [{len(letter.record.value or b'')} bytes, "
              f"group {letter.consumer_group}, dead letter {letter.record.where}]\n")
    out.flush()


def dead_letter_json(letter: DeadLetter) -> str:
    return _json(letter.as_json())


def print_late_record(late: LateRecord, out: TextIO, *,
                      max_rows: int | None = DEFAULT_ROWS) -> None:
    """What came late, for which window, from where; then the rows (or, for the
    scale-out's late partial states, their results per group)."""
    window = f"window {_bounds(late.start_ms, late.end_ms)}{_chunk(late.chunk)}"
    if late.kind == "aggregate":
        out.write(f"late results for {window}, emitted before they came (scale-out): "
                  f"{late.frame.height} groups, not in the window's output\n")
    else:
        out.write(f"late rows from {late.origin} for {window}, emitted before they came: "
                  f"{late.frame.height} rows, not aggregated\n")
    _table(late.frame, out, max_rows)


def late_record_json(late: LateRecord) -> str:
    return _json({"kind": late.kind, "origin": late.origin,
                  "window_start": rfc3339_ms(late.start_ms),
                  "window_end": rfc3339_ms(late.end_ms), "chunk": list(late.chunk),
                  "late_record": late.record.where, "rows": _rows(late.frame)})


def _bounds(start_ms: int, end_ms: int) -> str:
    return f"[{rfc3339_ms(start_ms)}, {rfc3339_ms(end_ms)})"


def _chunk(chunk: tuple[int, int]) -> str:
    return "" if chunk == (1, 1) else f" chunk {chunk[0]}/{chunk[1]}"


def _table(frame: pl.DataFrame, out: TextIO, max_rows: int | None) -> None:
    with pl.Config(tbl_rows=-1 if max_rows is None else max_rows, tbl_cols=-1,
                   tbl_width_chars=200, tbl_hide_dataframe_shape=True):
        out.write(f"{frame}\n")
    out.flush()


def _rows(frame: pl.DataFrame) -> list[dict[str, object]]:
    return [{k: _finite(v) for k, v in row.items()}
            for row in rfc3339_columns(frame).to_dicts()]


def _json(document: dict[str, object]) -> str:
    return json.dumps(document, default=_jsonable, ensure_ascii=False)


def _jsonable(value: object) -> object:
    if isinstance(value, datetime):
        return rfc3339_datetime(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def _finite(value: object) -> object:
    """NaN and infinities are not JSON: null, as a missing aggregate would be."""
    return None if isinstance(value, float) and not math.isfinite(value) else value
