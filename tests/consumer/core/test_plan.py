from __future__ import annotations

import re

import pyarrow as pa
import pytest

from consumer.core.plan import (
    AggFunc,
    AggregationPlan,
    ColumnAgg,
    PlanError,
    SkippedColumn,
    derive_plan,
)

TS = pa.timestamp("ms", "UTC")


def plan_of(*fields: tuple[str, pa.DataType], **kwargs: object) -> AggregationPlan:
    return derive_plan(pa.schema(list(fields)), **kwargs)  # type: ignore[arg-type]


# -- default rules (the seed's build_sql_query) ------------------------------------------


@pytest.mark.parametrize(
    "dtype",
    [
        pa.string(), pa.large_string(), pa.string_view(),
        pa.dictionary(pa.int32(), pa.string()), pa.dictionary(pa.int8(), pa.large_string()),
        pa.timestamp("s"), pa.timestamp("ns", "Europe/Paris"),
    ],
)
def test_string_and_timestamp_columns_are_keys(dtype: pa.DataType) -> None:
    plan = plan_of(("k", dtype), ("v", pa.int64()))
    assert plan.keys == ("k",)
    assert plan.aggregates == (ColumnAgg("v", "sum"),)


@pytest.mark.parametrize(
    ("name", "func"),
    [
        ("bytes_sum", "sum"), ("hits_count", "sum"), ("latency_min", "min"),
        ("latency_max", "max"), ("temperature", "sum"), ("max_latency", "sum"),
        ("sum", "sum"), ("x_minimum", "sum"),
    ],
)
def test_numeric_name_rules(name: str, func: AggFunc) -> None:
    assert plan_of(("k", pa.string()), (name, pa.float64())).aggregates == (ColumnAgg(name, func),)


@pytest.mark.parametrize(
    "dtype",
    [
        pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(),
        pa.uint64(), pa.float16(), pa.float32(), pa.float64(), pa.decimal128(10, 2),
    ],
)
def test_every_numeric_width_aggregates(dtype: pa.DataType) -> None:
    plan = plan_of(("v_min", dtype), ("w", dtype))
    assert plan.aggregates == (ColumnAgg("v_min", "min"), ColumnAgg("w", "sum"))
    assert plan.keys == ()


@pytest.mark.parametrize(
    "dtype",
    [
        pa.bool_(), pa.binary(), pa.large_binary(), pa.list_(pa.int64()), pa.date32(),
        pa.time64("us"), pa.duration("ms"), pa.decimal256(40, 2),
        pa.struct([("a", pa.int64())]), pa.dictionary(pa.int32(), pa.int64()), pa.null(),
    ],
)
def test_other_types_are_skipped_with_their_type(dtype: pa.DataType) -> None:
    plan = plan_of(("k", pa.string()), ("odd", dtype))
    (skipped,) = plan.skipped
    assert (skipped.name, skipped.dtype) == ("odd", str(dtype))
    assert str(dtype) in skipped.reason
    assert "aggregation.columns" in skipped.reason
    assert plan.keys == ("k",)
    assert plan.aggregates == ()


def test_keys_and_aggregates_keep_schema_order() -> None:
    plan = plan_of(
        ("b", pa.string()), ("y", pa.int32()), ("a", pa.large_string()),
        ("x_max", pa.float32()), ("when", TS),
    )
    assert plan.keys == ("b", "a", "when")
    assert plan.aggregates == (ColumnAgg("y", "sum"), ColumnAgg("x_max", "max"))
    assert plan.time_column is None


# -- time column ------------------------------------------------------------------------


def test_time_column_is_neither_key_nor_aggregate() -> None:
    plan = plan_of(("ts", TS), ("host", pa.string()), ("n", pa.int64()), time_column="ts")
    assert plan.time_column == "ts"
    assert plan.keys == ("host",)
    assert plan.aggregates == (ColumnAgg("n", "sum"),)
    assert plan.skipped == ()


def test_integer_epoch_ms_time_column_is_not_summed() -> None:
    plan = plan_of(("ts", pa.int64()), ("n", pa.int64()), time_column="ts")
    assert plan.aggregates == (ColumnAgg("n", "sum"),)


def test_missing_time_column() -> None:
    with pytest.raises(PlanError, match="time column 'when' is not in the schema"):
        plan_of(("ts", TS), ("n", pa.int64()), time_column="when")


@pytest.mark.parametrize("dtype", [pa.string(), pa.float64(), pa.date32()])
def test_time_column_of_wrong_type(dtype: pa.DataType) -> None:
    with pytest.raises(PlanError, match=re.escape(f"time column 'ts' has type {dtype}")):
        plan_of(("ts", dtype), ("n", pa.int64()), time_column="ts")


# -- explicit keys ----------------------------------------------------------------------


def test_explicit_keys_replace_the_defaults_in_configured_order() -> None:
    plan = plan_of(
        ("host", pa.string()), ("region", pa.string()), ("code", pa.int32()),
        ("at", TS), ("bytes_sum", pa.int64()), keys=["code", "host"],
    )
    assert plan.keys == ("code", "host")
    assert plan.aggregates == (ColumnAgg("bytes_sum", "sum"),)
    assert [(s.name, s.dtype) for s in plan.skipped] == [
        ("region", "string"), ("at", str(TS)),
    ]
    assert all("not among the configured keys" in s.reason for s in plan.skipped)


def test_empty_explicit_keys_mean_one_group() -> None:
    plan = plan_of(("host", pa.string()), ("n", pa.int64()), keys=[])
    assert plan.keys == ()
    assert plan.aggregates == (ColumnAgg("n", "sum"),)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (["nope"], "key column 'nope' is not in the schema"),
        (["ts"], "key column 'ts' is the time column"),
        (["host", "host"], "key column 'host' is listed twice"),
    ],
)
def test_explicit_key_errors(keys: list[str], message: str) -> None:
    with pytest.raises(PlanError, match=message):
        plan_of(("ts", TS), ("host", pa.string()), ("n", pa.int64()), time_column="ts", keys=keys)


# -- overrides --------------------------------------------------------------------------


def test_overrides_replace_the_rule_and_rescue_skipped_columns() -> None:
    plan = plan_of(
        ("host", pa.string()), ("lat", pa.float64()), ("ok", pa.bool_()),
        ("day", pa.date32()), ("n_sum", pa.int64()),
        overrides={"lat": "mean", "ok": "count", "day": "max", "n_sum": "last"},
    )
    assert plan.aggregates == (
        ColumnAgg("lat", "mean"), ColumnAgg("ok", "count"),
        ColumnAgg("day", "max"), ColumnAgg("n_sum", "last"),
    )
    assert plan.skipped == ()


def test_override_a_string_column_that_is_not_a_key() -> None:
    plan = plan_of(
        ("host", pa.string()), ("status", pa.string_view()), ("n", pa.int64()),
        keys=["host"], overrides={"status": "min"},
    )
    assert plan.aggregates == (ColumnAgg("status", "min"), ColumnAgg("n", "sum"))


@pytest.mark.parametrize(
    ("dtype", "func"),
    [
        (pa.int8(), "mean"), (pa.float16(), "sum"), (pa.string(), "first"),
        (pa.list_(pa.int8()), "count"), (pa.binary(), "last"), (pa.timestamp("us"), "min"),
        (pa.time32("s"), "max"), (pa.duration("ns"), "min"), (pa.large_string(), "max"),
    ],
)
def test_overrides_that_fit(dtype: pa.DataType, func: AggFunc) -> None:
    plan = plan_of(("k", pa.int64()), ("c", dtype), keys=["k"], overrides={"c": func})
    assert plan.aggregates == (ColumnAgg("c", func),)


@pytest.mark.parametrize(
    ("dtype", "func", "needs"),
    [
        (pa.string(), "sum", "sum needs a numeric column"),
        (pa.bool_(), "mean", "mean needs a numeric column"),
        (pa.timestamp("ms"), "sum", "sum needs a numeric column"),
        (pa.bool_(), "min", "min needs a numeric, temporal or string column"),
        (pa.list_(pa.int64()), "max", "max needs a numeric, temporal or string column"),
    ],
)
def test_overrides_that_do_not_fit(dtype: pa.DataType, func: AggFunc, needs: str) -> None:
    with pytest.raises(PlanError, match=re.escape(f"aggregation for 'c': {needs}, not {dtype}")):
        plan_of(("k", pa.int64()), ("c", dtype), keys=["k"], overrides={"c": func})


def test_override_of_unknown_column() -> None:
    with pytest.raises(PlanError, match="aggregation for 'ghost': no such column"):
        plan_of(("k", pa.string()), overrides={"ghost": "sum"})


def test_override_of_unknown_function() -> None:
    with pytest.raises(PlanError, match="aggregation for 'n': unknown function 'mode'"):
        plan_of(("n", pa.int64()), overrides={"n": "mode"})


def test_override_of_a_default_key() -> None:
    with pytest.raises(PlanError, match="aggregation for 'host': it is a group key"):
        plan_of(("host", pa.string()), ("n", pa.int64()), overrides={"host": "first"})


def test_override_of_an_explicit_key() -> None:
    with pytest.raises(PlanError, match="aggregation for 'n': it is a group key"):
        plan_of(("n", pa.int64()), ("m", pa.int64()), keys=["n"], overrides={"n": "sum"})


def test_override_of_the_time_column() -> None:
    with pytest.raises(PlanError, match="aggregation for 'ts': it is the time column"):
        plan_of(("ts", TS), ("n", pa.int64()), time_column="ts", overrides={"ts": "max"})


# -- whole-plan errors ------------------------------------------------------------------


def test_nothing_to_group_or_aggregate() -> None:
    with pytest.raises(PlanError, match="no column to group by or aggregate"):
        plan_of(("ts", TS), ("ok", pa.bool_()), time_column="ts")


def test_empty_schema() -> None:
    with pytest.raises(PlanError, match="no column to group by or aggregate"):
        plan_of()


def test_duplicate_column_names() -> None:
    with pytest.raises(PlanError, match="duplicate column names"):
        plan_of(("n", pa.int64()), ("n", pa.int32()))


@pytest.mark.parametrize("name", ["row_count", "window_start", "window_end", "__rows"])
def test_result_column_names_are_reserved(name: str) -> None:
    with pytest.raises(PlanError, match=f"column '{name}' clashes with a result column"):
        plan_of(("k", pa.string()), (name, pa.int64()))


def test_reserved_name_on_a_skipped_column_is_harmless() -> None:
    plan = plan_of(("k", pa.string()), ("row_count", pa.bool_()))
    assert plan.keys == ("k",)


# -- awkward names ----------------------------------------------------------------------

def test_awkward_names_just_work() -> None:
    plan = plan_of(
        ('say "hi"', pa.int64()), ("it's", pa.string()), ("two words", pa.float32()),
        ("größe_max", pa.int16()), ("名前", pa.string()), ("a;DROP TABLE t", pa.int8()),
        ("", pa.large_string()), (" ", pa.uint8()), ('"', TS),
        overrides={'say "hi"': "mean"}, time_column='"',
    )
    assert plan.keys == ("it's", "名前", "")
    assert plan.aggregates == (
        ColumnAgg('say "hi"', "mean"), ColumnAgg("two words", "sum"),
        ColumnAgg("größe_max", "max"), ColumnAgg("a;DROP TABLE t", "sum"), ColumnAgg(" ", "sum"),
    )
    assert plan.time_column == '"'


# -- describe ---------------------------------------------------------------------------


def test_describe_mentions_every_column_and_why() -> None:
    plan = plan_of(
        ("ts", TS), ("host", pa.string()), ("bytes_sum", pa.int64()),
        ("lat_max", pa.float32()), ("temp", pa.int16()), ("ok", pa.bool_()),
        ("flag", pa.bool_()), ("名前 x", pa.large_string()),
        time_column="ts", overrides={"flag": "count"},
    )
    text = plan.describe()
    lines = text.splitlines()
    assert "time column: 'ts'" in lines[0]
    expectations = {
        "'host'": "string columns are group keys",
        "'名前 x'": "string columns are group keys",
        "'bytes_sum': sum": "name ends in _sum",
        "'lat_max': max": "name ends in _max",
        "'temp': sum": "without a _min/_max suffix",
        "'flag': count": "configured in aggregation.columns",
        "'ok'": "type bool has no default aggregation",
    }
    for column, why in expectations.items():
        (line,) = [line for line in lines if line.strip().startswith(column)]
        assert why in line


def test_describe_with_explicit_keys_and_no_keys() -> None:
    keyed = plan_of(("code", pa.int32()), ("n", pa.int64()), keys=["code"]).describe()
    assert "'code': int32, listed in aggregation.keys" in keyed
    assert "keys: none" in plan_of(("n", pa.int64())).describe()


def test_plan_equality_ignores_the_reasons() -> None:
    schema = pa.schema([("k", pa.string()), ("n", pa.int64())])
    assert derive_plan(schema) == AggregationPlan(("k",), (ColumnAgg("n", "sum"),), (), None)


def test_describe_says_an_integer_time_column_is_epoch_milliseconds() -> None:
    text = plan_of(("ts", pa.int64()), ("v", pa.float64()), time_column="ts").describe()
    assert text.splitlines()[0] == (
        "time column: 'ts' (int64, read as epoch milliseconds; assigns windows; never a key)")
    stamped = plan_of(("ts", TS), ("v", pa.float64()), time_column="ts").describe()
    assert stamped.splitlines()[0] == f"time column: 'ts' ({TS}; assigns windows; never a key)"


def test_an_unused_column_is_skipped_with_its_reason_unless_configured() -> None:
    fields = (("ts", TS), ("site", pa.string()), ("v", pa.float64()))
    plan = plan_of(*fields, unused={"ts": "not used by these windows"})
    assert plan.keys == ("site",)
    assert plan.skipped == (SkippedColumn("ts", str(TS), "not used by these windows"),)
    assert plan_of(*fields, unused={"ts": "x"}, keys=["site", "ts"]).keys == ("site", "ts")
    configured = plan_of(*fields, unused={"ts": "x"}, overrides={"ts": "max"})
    assert ColumnAgg("ts", "max") in configured.aggregates
