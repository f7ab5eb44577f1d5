from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from consumer.core.windows.bounds import WindowSpec, to_epoch_ms, window_ranges, with_window_start

YEAR_2500_MS = (datetime(2500, 1, 1, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(
    milliseconds=1
)


def brute_force_ranges(ts: int, size: int, step: int) -> list[tuple[int, int]]:
    """Every aligned start near ts, kept when its half-open window holds ts."""
    around = range((ts - size) // step - 2, ts // step + 3)
    return [(k * step, k * step + size) for k in around if k * step <= ts < k * step + size]


@st.composite
def specs(draw: st.DrawFn) -> WindowSpec:
    size = draw(st.integers(1, 10_000))
    return WindowSpec(size, draw(st.integers(1, size)))


# -- WindowSpec -------------------------------------------------------------------------


def test_tumbling_step_equals_size() -> None:
    assert WindowSpec.tumbling(60_000) == WindowSpec(60_000, 60_000)


def test_hopping_keeps_its_step() -> None:
    assert WindowSpec.hopping(60_000, 15_000) == WindowSpec(60_000, 15_000)


@pytest.mark.parametrize(("size", "step"), [(0, 0), (-5, -5), (10, 0), (10, -1), (10, 11)])
def test_invalid_spec_is_rejected(size: int, step: int) -> None:
    with pytest.raises(ValueError, match="window s"):
        WindowSpec(size, step)


# -- window_ranges ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ts", "expected"),
    [
        (0, [(0, 10)]),
        (9, [(0, 10)]),
        (10, [(10, 20)]),  # on a boundary: the window starting there, not the one ending
        (-1, [(-10, 0)]),
        (-10, [(-10, 0)]),
        (-11, [(-20, -10)]),
    ],
)
def test_tumbling_edges(ts: int, expected: list[tuple[int, int]]) -> None:
    assert window_ranges(ts, WindowSpec.tumbling(10)) == expected


@pytest.mark.parametrize(
    ("ts", "expected"),
    [
        (0, [(-5, 5), (0, 10)]),
        (4, [(-5, 5), (0, 10)]),
        (5, [(0, 10), (5, 15)]),
        (10, [(5, 15), (10, 20)]),
        (-1, [(-10, 0), (-5, 5)]),
    ],
)
def test_hopping_edges(ts: int, expected: list[tuple[int, int]]) -> None:
    assert window_ranges(ts, WindowSpec.hopping(10, 5)) == expected


def test_size_not_a_multiple_of_step() -> None:
    spec = WindowSpec.hopping(10, 3)
    assert window_ranges(0, spec) == [(-9, 1), (-6, 4), (-3, 7), (0, 10)]
    assert window_ranges(5, spec) == [(-3, 7), (0, 10), (3, 13)]
    assert window_ranges(-1, spec) == [(-9, 1), (-6, 4), (-3, 7)]


def test_far_future_timestamp() -> None:
    hour = 3_600_000
    assert YEAR_2500_MS % hour == 0
    assert window_ranges(YEAR_2500_MS, WindowSpec.tumbling(hour)) == [
        (YEAR_2500_MS, YEAR_2500_MS + hour)
    ]
    assert window_ranges(YEAR_2500_MS - 1, WindowSpec.hopping(2 * hour, hour)) == [
        (YEAR_2500_MS - 2 * hour, YEAR_2500_MS),
        (YEAR_2500_MS - hour, YEAR_2500_MS + hour),
    ]


def test_far_past_timestamp_floors() -> None:
    ts = -(10**12) - 1
    assert window_ranges(ts, WindowSpec.tumbling(1_000)) == [(-(10**12) - 1_000, -(10**12))]


@given(ts=st.integers(-(10**15), 10**15), spec=specs())
def test_window_ranges_matches_brute_force(ts: int, spec: WindowSpec) -> None:
    assert window_ranges(ts, spec) == brute_force_ranges(ts, spec.size_ms, spec.step_ms)


# -- with_window_start ------------------------------------------------------------------


def scalar_assignment(timestamps: list[int], spec: WindowSpec) -> pl.DataFrame:
    rows = [(ts, start) for ts in timestamps for start, _ in window_ranges(ts, spec)]
    return pl.DataFrame(rows, schema={"ts": pl.Int64, "window_start": pl.Int64}, orient="row")


@given(timestamps=st.lists(st.integers(-(10**13), 10**14), max_size=40), spec=specs())
def test_vectorised_assignment_equals_scalar(timestamps: list[int], spec: WindowSpec) -> None:
    frame = pl.LazyFrame({"ts": timestamps}, schema={"ts": pl.Int64})
    got = with_window_start(frame, "ts", spec).collect()
    assert_frame_equal(got, scalar_assignment(timestamps, spec))


def test_hopping_repeats_other_columns() -> None:
    frame = pl.LazyFrame({"ts": [5, 12], "v": ["a", "b"]})
    got = with_window_start(frame, "ts", WindowSpec.hopping(10, 5)).collect()
    expected = pl.DataFrame(
        {"ts": [5, 5, 12, 12], "v": ["a", "a", "b", "b"], "window_start": [0, 5, 5, 10]}
    )
    assert_frame_equal(got, expected)


def test_window_start_is_int64_from_narrow_integers() -> None:
    frame = pl.LazyFrame({"ts": [7, -7]}, schema={"ts": pl.Int32})
    got = with_window_start(frame, "ts", WindowSpec.tumbling(5)).collect()
    assert_frame_equal(got, pl.DataFrame({"ts": [7, -7], "window_start": [5, -10]},
                                         schema={"ts": pl.Int32, "window_start": pl.Int64}))


@pytest.mark.parametrize("spec", [WindowSpec.tumbling(10), WindowSpec.hopping(10, 5)])
def test_null_timestamp_gives_null_window_start(spec: WindowSpec) -> None:
    frame = pl.LazyFrame({"ts": [None]}, schema={"ts": pl.Int64})
    got = with_window_start(frame, "ts", spec).collect()
    assert got["window_start"].to_list() == [None]


# -- to_epoch_ms ------------------------------------------------------------------------

_PER_MS = {"s": (1_000, 1), "ms": (1, 1), "us": (1, 1_000), "ns": (1, 1_000_000)}


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
@pytest.mark.parametrize("tz", [None, "UTC", "Asia/Kolkata", "America/St_Johns"])
def test_to_epoch_ms_every_unit_and_zone(unit: str, tz: str | None) -> None:
    raw = [0, 1, -1, 999_999, -1_000_001, 1_700_000_000_123]
    frame = pl.from_arrow(pa.table({"t": pa.array(raw, pa.timestamp(unit, tz))}))
    assert isinstance(frame, pl.DataFrame)
    got = frame.select(to_epoch_ms("t", frame.schema["t"]).alias("ms"))
    times, divide = _PER_MS[unit]
    expected = [v * times // divide for v in raw]  # Python's // floors, as required
    assert_frame_equal(got, pl.DataFrame({"ms": expected}, schema={"ms": pl.Int64}))


def test_to_epoch_ms_far_future_and_past() -> None:
    values = [datetime(2500, 1, 1, tzinfo=UTC), datetime(1938, 4, 24, 22, 13, 20, tzinfo=UTC)]
    frame = pl.DataFrame({"t": values}, schema={"t": pl.Datetime("us", "UTC")})
    got = frame.select(to_epoch_ms("t", frame.schema["t"]).alias("ms"))
    assert got["ms"].to_list() == [YEAR_2500_MS, -(10**12)]


@pytest.mark.parametrize("dtype", [pl.Int32, pl.Int64, pl.UInt16])
def test_to_epoch_ms_integer_passthrough(dtype: type[pl.DataType]) -> None:
    frame = pl.DataFrame({"t": [1, 2]}, schema={"t": dtype})
    got = frame.select(to_epoch_ms("t", frame.schema["t"]))
    assert_frame_equal(got, pl.DataFrame({"t": [1, 2]}, schema={"t": pl.Int64}))


def test_to_epoch_ms_rejects_other_types() -> None:
    with pytest.raises(TypeError, match="'t' has type String"):
        to_epoch_ms("t", pl.String())


def test_year_2500_window_start() -> None:
    frame = pl.DataFrame({"t": [datetime(2500, 1, 1, 0, 30, tzinfo=UTC)]},
                         schema={"t": pl.Datetime("ms", "UTC")})
    lazy = frame.lazy().with_columns(to_epoch_ms("t", frame.schema["t"]).alias("ms"))
    got = with_window_start(lazy, "ms", WindowSpec.hopping(3_600_000, 1_800_000)).collect()
    assert got["window_start"].to_list() == [YEAR_2500_MS, YEAR_2500_MS + 1_800_000]


def test_epoch_ms_then_windows_per_unit() -> None:
    frame = pl.from_arrow(pa.table({"t": pa.array([-1, 1_500], pa.timestamp("ns", "UTC"))}))
    assert isinstance(frame, pl.DataFrame)
    lazy = frame.lazy().with_columns(to_epoch_ms("t", frame.schema["t"]).alias("ms"))
    got = with_window_start(lazy, "ms", WindowSpec.tumbling(1)).collect()
    assert got["window_start"].to_list() == [-1, 0]
