"""Window bounds over integer epoch milliseconds, scalar and vectorised.

Windows are half-open, ``[start, start + size_ms)``, and aligned to the epoch: every
start is a multiple of ``step_ms``. Tumbling windows have ``step_ms == size_ms``; hopping
windows overlap, so one row belongs to several of them. Floor division keeps the
alignment for timestamps before 1970.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from consumer.core.types import WINDOW_START


@dataclass(frozen=True)
class WindowSpec:
    size_ms: int
    step_ms: int

    def __post_init__(self) -> None:
        if self.size_ms <= 0:
            raise ValueError(f"window size_ms must be positive, got {self.size_ms}")
        if not 0 < self.step_ms <= self.size_ms:
            raise ValueError(
                f"window step_ms must be in (0, size_ms={self.size_ms}], got {self.step_ms}"
            )

    @classmethod
    def tumbling(cls, size_ms: int) -> WindowSpec:
        return cls(size_ms=size_ms, step_ms=size_ms)

    @classmethod
    def hopping(cls, size_ms: int, step_ms: int) -> WindowSpec:
        return cls(size_ms=size_ms, step_ms=step_ms)

    @property
    def is_tumbling(self) -> bool:
        return self.step_ms == self.size_ms


def window_ranges(ts_ms: int, spec: WindowSpec) -> list[tuple[int, int]]:
    """Every window ``[start, end)`` holding ``ts_ms``, ordered by start."""
    last_start = ts_ms // spec.step_ms * spec.step_ms
    first_start = _first_start(ts_ms, spec)
    return [
        (start, start + spec.size_ms)
        for start in range(first_start, last_start + 1, spec.step_ms)
    ]


def with_window_start(frame: pl.LazyFrame, ts_ms_column: str, spec: WindowSpec) -> pl.LazyFrame:
    """Add an Int64 ``window_start`` column; under hopping windows a row is repeated once
    per window holding it (in order of start). A null timestamp gives a null start."""
    ts = pl.col(ts_ms_column).cast(pl.Int64)
    last_start = ts // spec.step_ms * spec.step_ms
    if spec.is_tumbling:
        return frame.with_columns(last_start.alias(WINDOW_START))
    starts = pl.int_ranges(_first_start_expr(ts, spec), last_start + 1, spec.step_ms)
    return frame.with_columns(starts.alias(WINDOW_START)).explode(WINDOW_START)


def to_epoch_ms(column: str, dtype: pl.DataType) -> pl.Expr:
    """Int64 epoch milliseconds from a Datetime of any unit and zone (floored below a
    millisecond) or from an integer column already in epoch milliseconds."""
    if isinstance(dtype, pl.Datetime):
        # The physical value is UTC-based whatever the zone, so the zone needs no handling.
        return pl.col(column).dt.epoch("ms").cast(pl.Int64)
    if dtype.is_integer():
        return pl.col(column).cast(pl.Int64)
    raise TypeError(
        f"column {column!r} has type {dtype}; event time needs a Datetime or an integer "
        "of epoch milliseconds"
    )


def _first_start(ts_ms: int, spec: WindowSpec) -> int:
    # The earliest aligned start whose window still reaches ts: start > ts - size.
    return (ts_ms - spec.size_ms) // spec.step_ms * spec.step_ms + spec.step_ms


def _first_start_expr(ts: pl.Expr, spec: WindowSpec) -> pl.Expr:
    return (ts - spec.size_ms) // spec.step_ms * spec.step_ms + spec.step_ms
