"""What the window engines' tests share: a schema of one key and three aggregates, rows
as tuples, engines built small, and a reference computed by plain Polars."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import polars as pl
import pyarrow as pa
from polars.testing import assert_frame_equal

from consumer.core.offsets import CommitPoint
from consumer.core.plan import derive_plan
from consumer.core.types import ClosedWindow, MessageRef
from consumer.core.windows.bounds import WindowSpec
from consumer.core.windows.count.engine import CountWindowEngine
from consumer.core.windows.time.engine import TimeWindowEngine

P0 = ("events", 0)
P1 = ("events", 1)
UTC_MS = pl.Datetime("ms", "UTC")

# (k, ts in epoch ms, v_sum, n_count, v_max); values are dyadic so float sums are exact.
Row = tuple[str, int, float, int, float]

SCHEMA = pa.schema([
    ("k", pa.string()),
    ("ts", pa.timestamp("ms", "UTC")),
    ("v_sum", pa.float64()),
    ("n_count", pa.int64()),
    ("v_max", pa.float64()),
])
EVENT_PLAN = derive_plan(SCHEMA, time_column="ts")
# Processing time: no time column, so "ts" is dropped from the input.
PROCESSING_SCHEMA = pa.schema([f for f in SCHEMA if f.name != "ts"])
PROCESSING_PLAN = derive_plan(PROCESSING_SCHEMA)
RESULT_SCHEMA: dict[str, pl.DataType] = {
    "window_start": UTC_MS, "window_end": UTC_MS, "k": pl.String(), "v_sum": pl.Float64(),
    "n_count": pl.Int64(), "v_max": pl.Float64(), "row_count": pl.Int64(),
}



def frame(rows: Sequence[Row], *, with_ts: bool = True) -> pl.DataFrame:
    columns: list[list[object]] = [[row[i] for row in rows] for i in range(len(SCHEMA))]
    table = pa.table(dict(zip(SCHEMA.names, columns, strict=True)), schema=SCHEMA)
    if not with_ts:
        table = table.drop_columns(["ts"])
    return pl.DataFrame(table)


def time_engine(*, spec: WindowSpec | None = None, lateness_ms: int = 0,
                idle_timeout_ms: int = 60_000, merge_every: int = 2,
                provisional: bool = False) -> TimeWindowEngine:
    return TimeWindowEngine(
        EVENT_PLAN, spec or WindowSpec.tumbling(1_000), event_time=True, time_dtype=UTC_MS,
        allowed_lateness_ms=lateness_ms, idle_timeout_ms=idle_timeout_ms,
        merge_every=merge_every, provisional=provisional,
    )


def processing_engine(*, size_ms: int = 1_000, merge_every: int = 2) -> TimeWindowEngine:
    return TimeWindowEngine(
        PROCESSING_PLAN, WindowSpec.tumbling(size_ms), event_time=False, time_dtype=None,
        allowed_lateness_ms=0, idle_timeout_ms=60_000, merge_every=merge_every,
    )


def count_engine(*, batches: int | None = None, rows: int | None = None,
                 idle_timeout_ms: int = 60_000, merge_every: int = 2,
                 provisional: bool = False) -> CountWindowEngine:
    return CountWindowEngine(EVENT_PLAN, batches=batches, rows=rows,
                             idle_timeout_ms=idle_timeout_ms, merge_every=merge_every,
                             provisional=provisional)


def ref(partition: tuple[str, int], offset: int, rows: Sequence[Row]) -> MessageRef:
    times = [r[1] for r in rows]
    return MessageRef(partition, offset, len(rows), min(times, default=None),
                      max(times, default=None))


def feed(engine: TimeWindowEngine | CountWindowEngine, partition: tuple[str, int],
         offset: int, rows: Sequence[Row], now_ms: int) -> pl.DataFrame | None:
    """Add one message's rows."""
    return engine.add(frame(rows), [ref(partition, offset, rows)], now_ms)


def commit_points(engine: TimeWindowEngine | CountWindowEngine,
                  ) -> dict[tuple[str, int], CommitPoint]:
    """The engine's commit points; these tests never hold output back."""
    found = engine.commit_points()
    assert found is not None
    return found


def at(rows: Iterable[Row], ts_ms: int) -> list[Row]:
    """``rows`` with their time replaced by ``ts_ms`` (processing time, count windows)."""
    return [(k, ts_ms, v_sum, n_count, v_max) for k, _, v_sum, n_count, v_max in rows]


def windows_of(ts_ms: int, size_ms: int, step_ms: int) -> list[int]:
    """Starts of the aligned windows holding ``ts_ms``, by scanning (not by formula)."""
    first = ts_ms - size_ms - step_ms
    first -= first % step_ms
    return [s for s in range(first, ts_ms + 1, step_ms) if s <= ts_ms < s + size_ms]


def reference(rows: Iterable[Row], size_ms: int = 1_000,
              step_ms: int | None = None) -> dict[int, pl.DataFrame]:
    """The expected result frame per window start, computed with plain dicts."""
    groups: dict[int, dict[str, list[float]]] = {}
    for k, ts, v_sum, n_count, v_max in rows:
        for start in windows_of(ts, size_ms, step_ms or size_ms):
            acc = groups.setdefault(start, {}).setdefault(k, [0.0, 0, float("-inf"), 0])
            acc[0] += v_sum
            acc[1] += n_count
            acc[2] = max(acc[2], v_max)
            acc[3] += 1
    return {
        start: pl.DataFrame(
            [(start, start + size_ms, k, a[0], int(a[1]), a[2], int(a[3]))
             for k, a in sorted(by_key.items())],
            schema={**RESULT_SCHEMA, "window_start": pl.Int64(), "window_end": pl.Int64()},
            orient="row",
        ).with_columns(pl.col("window_start", "window_end").cast(UTC_MS))
        for start, by_key in sorted(groups.items())
    }


def check_windows(closed: Sequence[ClosedWindow], expected: dict[int, pl.DataFrame]) -> None:
    assert [w.start_ms for w in closed] == list(expected)
    for window in closed:
        want = expected[window.start_ms]
        assert window.end_ms == want["window_end"].dt.epoch("ms")[0]
        assert window.frame.schema == pl.Schema(RESULT_SCHEMA)
        assert_frame_equal(window.frame.sort("k"), want)
        assert window.input_rows == int(want["row_count"].sum())


def starts(closed: Sequence[ClosedWindow]) -> list[int]:
    return [w.start_ms for w in closed]
