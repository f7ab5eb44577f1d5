"""Times as people and JSON read them: RFC 3339, in UTC, with a ``Z``.

One form everywhere arrowagg writes text: JSON output (``output.format: json``), ``tail
--format json`` (headers, rows, dead letters, late records), the terminal view and the
daemon's log. Window bounds are whole milliseconds (``2025-01-31T12:00:00.000Z``); a
timestamp column keeps the digits of its unit (3 for ms, 6 for us, 9 for ns), so two
distinct keys never print alike. A timestamp without a time zone is read as UTC, as the
daemon's windows read it (epoch-based), and written with the ``Z`` as well.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import polars as pl

_FRACTION = {"ms": "%.3f", "us": "%.6f", "ns": "%.9f"}


def rfc3339_ms(epoch_ms: int) -> str:
    """``epoch_ms`` as ``YYYY-MM-DDTHH:MM:SS.mmmZ``."""
    seconds, millis = divmod(epoch_ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def rfc3339_datetime(value: datetime) -> str:
    """A Python datetime (aware: converted to UTC; naive: read as UTC), microseconds kept."""
    utc = value.astimezone(UTC) if value.tzinfo is not None else value
    return utc.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rfc3339_columns(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with every timestamp column as RFC 3339 text in UTC (lists of timestamps
    too: a revised session's ``replaces``)."""
    stamps = []
    for name, dtype in frame.schema.items():
        if isinstance(dtype, pl.Datetime):
            stamps.append(_as_text(pl.col(name), dtype))
        elif isinstance(dtype, pl.List) and isinstance(dtype.inner, pl.Datetime):
            stamps.append(pl.col(name).list.eval(_as_text(pl.element(), dtype.inner)))
    return frame.with_columns(stamps) if stamps else frame


def _as_text(column: pl.Expr, dtype: pl.Datetime) -> pl.Expr:
    if dtype.time_zone is not None:
        column = column.dt.convert_time_zone("UTC")
    return column.dt.strftime(f"%Y-%m-%dT%H:%M:%S{_FRACTION[dtype.time_unit]}Z")
