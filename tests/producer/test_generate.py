from __future__ import annotations

import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

from producer.generate import SENSOR_SCHEMA, sensor_batch

START_MS = 1_735_689_600_000  # 2025-01-01T00:00:00Z


def frame(**overrides: int) -> pl.DataFrame:
    args = {"rows": 5_000, "groups": 40, "start_ms": START_MS, "span_ms": 1_000, "seed": 7}
    result = pl.from_arrow(sensor_batch(**{**args, **overrides}))
    assert isinstance(result, pl.DataFrame)
    return result


def test_columns_come_in_the_documented_order_and_types() -> None:
    table = sensor_batch(rows=10, groups=3, start_ms=START_MS, span_ms=10, seed=1)
    assert table.schema == SENSOR_SCHEMA
    assert table.column_names == [
        "site", "sensor", "ts", "reading_sum", "reading_count", "reading_min", "reading_max",
        "power", "error_count",
    ]
    assert table.schema.field("ts").type == pa.timestamp("ms", tz="UTC")


@pytest.mark.parametrize(("rows", "groups", "expected"), [(5_000, 40, 40), (30, 40, 30),
                                                          (1, 1, 1), (100, 1_000, 100)])
def test_rows_cycle_through_the_site_sensor_pairs(rows: int, groups: int, expected: int) -> None:
    pairs = frame(rows=rows, groups=groups).select("site", "sensor").unique()
    assert pairs.height == expected


def test_keys_look_like_sites_and_sensors() -> None:
    names = frame(groups=16).select("site", "sensor").unique().sort("site", "sensor")
    assert names["site"].unique().sort().to_list() == ["site-00", "site-01"]
    assert names["sensor"].unique().sort().to_list() == [f"sensor-{i:02d}" for i in range(8)]


def test_event_times_fall_in_the_span() -> None:
    stamps: list[int] = frame(span_ms=250)["ts"].dt.epoch("ms").to_list()
    assert min(stamps) >= START_MS
    assert max(stamps) < START_MS + 250
    assert len(set(stamps)) > 200  # spread over the span, not piled on its start


def test_readings_are_consistent_summaries() -> None:
    data = frame()
    assert data["reading_count"].min() == 1
    assert data["reading_count"].max() == 10
    mean = data["reading_sum"] / data["reading_count"]
    assert (data["reading_min"] <= mean).all()
    assert (mean <= data["reading_max"]).all()
    assert data["error_count"].is_in([0, 1]).all()
    assert 0 < data["error_count"].sum() < data.height / 10


def test_the_same_seed_gives_the_same_batch_and_another_seed_another() -> None:
    assert_frame_equal(frame(seed=3), frame(seed=3))
    assert not frame(seed=3).equals(frame(seed=4))


@pytest.mark.parametrize("seed", [-1, 2**70])
def test_any_integer_is_a_seed(seed: int) -> None:
    assert_frame_equal(frame(seed=seed), frame(seed=seed))


def test_zero_rows_is_an_empty_batch_of_the_schema() -> None:
    table = sensor_batch(rows=0, groups=5, start_ms=0, span_ms=1, seed=0)
    assert table.num_rows == 0
    assert table.schema == SENSOR_SCHEMA


@pytest.mark.parametrize("bad", [{"rows": -1}, {"groups": 0}, {"span_ms": 0}])
def test_impossible_arguments_raise(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="need rows"):
        frame(**bad)
