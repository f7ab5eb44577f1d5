"""RFC 3339 in UTC, one form for every time arrowagg writes as text."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import polars as pl

from tests.wire.helpers import RFC3339_UTC
from wire.timestamps import rfc3339_columns, rfc3339_datetime, rfc3339_ms

INSTANT = datetime(2025, 1, 31, 12, 0, 5, 123456, tzinfo=UTC)


def test_epoch_milliseconds_are_whole_milliseconds_in_utc() -> None:
    assert rfc3339_ms(1_738_324_805_123) == "2025-01-31T12:00:05.123Z"
    assert rfc3339_ms(0) == "1970-01-01T00:00:00.000Z"
    assert rfc3339_ms(-1) == "1969-12-31T23:59:59.999Z"


def test_python_datetimes_in_any_zone_come_out_in_utc() -> None:
    paris = INSTANT.astimezone(timezone(timedelta(hours=1)))
    assert rfc3339_datetime(paris) == "2025-01-31T12:00:05.123456Z"
    assert rfc3339_datetime(INSTANT.replace(tzinfo=None)) == "2025-01-31T12:00:05.123456Z"


def test_columns_keep_their_unit_digits_and_every_zone_becomes_utc() -> None:
    naive = pl.DataFrame({"t": [INSTANT.replace(tzinfo=None)]})
    frame = naive.select(
        pl.col("t").cast(pl.Datetime("ms", "UTC")).alias("ms_utc"),
        pl.col("t").cast(pl.Datetime("us")).dt.replace_time_zone("UTC")
        .dt.convert_time_zone("America/New_York").alias("us_new_york"),
        pl.col("t").cast(pl.Datetime("ns")).alias("ns_naive"),
        pl.lit(7).alias("other"),
    )
    text = rfc3339_columns(frame).row(0, named=True)
    assert text == {"ms_utc": "2025-01-31T12:00:05.123Z",
                    "us_new_york": "2025-01-31T12:00:05.123456Z",
                    "ns_naive": "2025-01-31T12:00:05.123456000Z", "other": 7}
    assert all(RFC3339_UTC.match(text[name]) for name in ("ms_utc", "us_new_york", "ns_naive"))
