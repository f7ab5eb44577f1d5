"""Synthetic sensor batches shaped like the pre-aggregated readings that started arrowagg.

Pure and deterministic: the same arguments give the same table, with no Kafka and no
clock. Random draws come from one seeded ``pyarrow.compute.random`` call and every column
is a vectorised Polars expression over them; nothing loops over rows in Python.
"""

from __future__ import annotations

from typing import Final

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

SENSORS_PER_SITE: Final = 8
MAX_READINGS_PER_ROW: Final = 10

SENSOR_SCHEMA: Final = pa.schema([
    pa.field("site", pa.string()),
    pa.field("sensor", pa.string()),
    pa.field("ts", pa.timestamp("ms", tz="UTC")),
    pa.field("reading_sum", pa.float64()),
    pa.field("reading_count", pa.int64()),
    pa.field("reading_min", pa.float64()),
    pa.field("reading_max", pa.float64()),
    pa.field("power", pa.float64()),
    pa.field("error_count", pa.int64()),
])

_DRAWS: Final = ("u_ts", "u_count", "u_mean", "u_spread", "u_power", "u_error")


def sensor_batch(
    *, rows: int, groups: int, start_ms: int, span_ms: int, seed: int, first_group: int = 0
) -> pa.Table:
    """One worker's batch of ``rows`` pre-aggregated readings, in ``SENSOR_SCHEMA``.

    Rows cycle through ``groups`` distinct (site, sensor) pairs, eight sensors a site,
    starting at pair ``first_group`` (mod ``groups``), so a batch of at least ``groups``
    rows holds every pair and consecutive batches can take turns through many pairs.
    ``ts`` is uniform in ``[start_ms, start_ms + span_ms)``. Each row summarises 1 to 10
    readings consistently (``reading_min <= reading_sum / reading_count <=
    reading_max``); about 3% of rows carry one error.
    """
    if rows < 0 or groups < 1 or span_ms < 1:
        raise ValueError(
            f"need rows >= 0, groups >= 1, span_ms >= 1; got {rows}, {groups}, {span_ms}"
        )
    draws = _uniform_draws(rows, seed)
    site_digits = max(2, len(str((groups - 1) // SENSORS_PER_SITE)))
    group = (pl.int_range(0, rows, dtype=pl.Int64) + first_group) % groups
    # Each sensor has its own level, so the per-group aggregates differ visibly.
    mean = 15.0 + (group % 97) * 0.25 + (pl.col("u_mean") - 0.5) * 4.0
    spread = pl.col("u_spread") * 3.0
    count = (pl.col("u_count") * MAX_READINGS_PER_ROW).floor().cast(pl.Int64) + 1
    site = (group // SENSORS_PER_SITE).cast(pl.String).str.zfill(site_digits)
    sensor = (group % SENSORS_PER_SITE).cast(pl.String).str.zfill(2)
    frame = draws.select(
        site=pl.format("site-{}", site),
        sensor=pl.format("sensor-{}", sensor),
        ts=(start_ms + (pl.col("u_ts") * span_ms).floor().cast(pl.Int64)).cast(
            pl.Datetime("ms", "UTC")
        ),
        reading_sum=mean * count,
        reading_count=count,
        reading_min=mean - spread,
        reading_max=mean + spread,
        power=100.0 + pl.col("u_power") * 50.0,
        error_count=(pl.col("u_error") > 0.97).cast(pl.Int64),
    )
    return frame.to_arrow().cast(SENSOR_SCHEMA)


def _uniform_draws(rows: int, seed: int) -> pl.DataFrame:
    """Independent uniform [0, 1) columns, one per random quantity, from a single seed."""
    # pyarrow takes a 64-bit unsigned seed; folding keeps any Python int usable.
    values = pc.random(rows * len(_DRAWS), initializer=seed % (1 << 63))
    return pl.DataFrame({
        name: pl.from_arrow(values.slice(index * rows, rows)) for index, name in enumerate(_DRAWS)
    })
