from __future__ import annotations

import logging
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

from consumer.core.decode import Decoder, RejectedMessageError, poll_frame
from consumer.core.plan import AggregationPlan, derive_plan
from wire.input import CONTENT_TYPE, DecodeLimits, encode_ipc_stream

SCHEMA = pa.schema([
    ("k", pa.string()),
    ("ts", pa.timestamp("ms", "UTC")),
    ("v_sum", pa.float64()),
    ("n_count", pa.int64()),
    ("v_max", pa.float64()),
    ("flag", pa.bool_()),  # no default aggregation: skipped
])
PLAN_COLUMNS = ["k", "ts", "v_sum", "n_count", "v_max"]
POLARS_TIMESTAMP = {
    "s": pl.Datetime("ms", "UTC"), "ms": pl.Datetime("ms", "UTC"),
    "us": pl.Datetime("us", "UTC"), "ns": pl.Datetime("ns", "UTC"),
}


def make_plan(schema: pa.Schema) -> AggregationPlan:
    return derive_plan(schema, time_column="ts")


def decoder(*, max_message_bytes: int = 1 << 20,
            limits: DecodeLimits | None = None) -> Decoder:
    return Decoder(make_plan, limits=limits or DecodeLimits(),
                   max_message_bytes=max_message_bytes)


def table(rows: int = 3, **replace: Any) -> pa.Table:
    """A valid input table; ``replace`` swaps (or with None, drops) columns by name."""
    columns: dict[str, Any] = {
        "k": pa.array([f"k{i % 2}" for i in range(rows)]),
        "ts": pa.array([1_000 * i for i in range(rows)], pa.timestamp("ms", "UTC")),
        "v_sum": pa.array([i * 0.5 for i in range(rows)]),
        "n_count": pa.array(list(range(rows)), pa.int64()),
        "v_max": pa.array([float(i) for i in range(rows)]),
        "flag": pa.array([i % 2 == 0 for i in range(rows)]),
    }
    for name, column in replace.items():
        if column is None:
            del columns[name]
        else:
            columns[name] = column
    return pa.table(columns)


def rejection(dec: Decoder, value: bytes | None,
              headers: list[tuple[str, bytes]] | None = None) -> RejectedMessageError:
    with pytest.raises(RejectedMessageError) as info:
        dec.decode(value, headers)
    assert str(info.value).startswith(f"{info.value.reason}: ")
    return info.value


def fixed_decoder() -> Decoder:
    dec = decoder()
    dec.decode(encode_ipc_stream(table()), None)
    return dec


# -- fixing the plan ---------------------------------------------------------------------


def test_first_message_fixes_the_plan(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="consumer.core.decode")
    dec = decoder()
    plan_before, dtype_before = dec.plan, dec.time_dtype()
    assert plan_before is None
    assert dtype_before is None
    decoded = dec.decode(encode_ipc_stream(table()), None)
    assert dec.plan == make_plan(SCHEMA)
    assert dec.time_dtype() == pl.Datetime("ms", "UTC")
    assert decoded.table.schema.names == PLAN_COLUMNS
    assert decoded.table.equals(table().drop_columns(["flag"]))
    assert decoded.max_event_ms == 2_000
    skipped = [r.getMessage() for r in caplog.records if "is skipped" in r.getMessage()]
    assert skipped == [(
        "column 'flag' (bool) is skipped: type bool has no default aggregation "
        "(give it one in aggregation.columns)"
    )]
    assert any("aggregation plan fixed" in r.getMessage() for r in caplog.records)


def test_later_messages_do_not_change_the_plan(caplog: pytest.LogCaptureFixture) -> None:
    dec = fixed_decoder()
    plan = dec.plan
    caplog.set_level(logging.INFO, logger="consumer.core.decode")
    caplog.clear()  # only what the later message logs counts
    # A new string column would be a key if it fixed the plan; here it is ignored.
    extra = table(2).append_column("site", pa.array(["x", "y"]))
    decoded = dec.decode(encode_ipc_stream(extra), None)
    assert dec.plan is plan
    assert decoded.table.schema.names == PLAN_COLUMNS
    assert decoded.table.equals(table(2).drop_columns(["flag"]))
    assert caplog.records == []


def test_extra_columns_in_any_order_are_projected() -> None:
    dec = fixed_decoder()
    shuffled = table(2).select(["flag", "v_max", "n_count", "ts", "v_sum", "k"])
    decoded = dec.decode(encode_ipc_stream(shuffled), None)
    assert decoded.table.schema.names == PLAN_COLUMNS
    assert decoded.table.equals(table(2).drop_columns(["flag"]))


def test_a_skipped_column_may_be_absent_later() -> None:
    dec = fixed_decoder()
    decoded = dec.decode(encode_ipc_stream(table(2, flag=None)), None)
    assert decoded.table.num_rows == 2


def test_first_message_the_plan_cannot_honour_is_rejected() -> None:
    dec = decoder()
    err = rejection(dec, encode_ipc_stream(table(ts=None)))
    assert err.reason == "schema-mismatch"
    assert "time column 'ts'" in err.detail
    assert dec.plan is None
    dec.decode(encode_ipc_stream(table()), None)  # a later good message fixes it
    assert dec.plan == make_plan(SCHEMA)


def test_a_pinned_schema_gives_the_plan_before_any_message() -> None:
    schema = pa.schema([("k", pa.string()), ("ts", pa.timestamp("ms", "UTC")),
                        ("v_sum", pa.float64())])
    plan = derive_plan(schema, time_column="ts")
    dec = Decoder(make_plan, limits=DecodeLimits(), max_message_bytes=1 << 20)
    dec.pin(schema, "a test")
    decoded = dec.decode(encode_ipc_stream(table()), None)
    assert dec.plan == plan
    assert decoded.table.schema.names == ["k", "ts", "v_sum"]


# -- later messages against the plan -----------------------------------------------------


def test_missing_key_or_time_column_is_a_schema_mismatch() -> None:
    for name in ("k", "ts"):
        dropped: dict[str, Any] = {name: None}
        err = rejection(fixed_decoder(), encode_ipc_stream(table(**dropped)))
        assert err.reason == "schema-mismatch"
        assert f"missing key/time columns [{name!r}]" in err.detail


def test_missing_aggregate_column_counts_as_all_null_and_says_so_once(
        caplog: pytest.LogCaptureFixture) -> None:
    dec = fixed_decoder()
    with caplog.at_level(logging.WARNING, logger="consumer.core.decode"):
        for _ in range(3):
            decoded = dec.decode(encode_ipc_stream(table(v_max=None)), None)
    assert decoded.table.schema.names == PLAN_COLUMNS
    assert decoded.table.column("v_max").null_count == 3
    assert decoded.table.column("v_sum").to_pylist() == [0.0, 0.5, 1.0]
    warned = [r.getMessage() for r in caplog.records]
    assert warned == [("messages without aggregate column(s) ['v_max']: counted as null there "
                      "(docs/reliability.md, schema evolution)")]


def test_a_message_without_rows_does_not_fix_the_plan() -> None:
    dec = decoder()
    other = pa.table({"unrelated": pa.array([], pa.int64())})  # a worker's warm-up message
    first = dec.decode(encode_ipc_stream(other), None)
    assert first.table.num_rows == 0
    assert first.max_event_ms is None
    assert dec.plan is None
    fixed = dec.decode(encode_ipc_stream(table()), None)
    assert fixed.table.schema.names == PLAN_COLUMNS  # the plan came from the real rows


def test_a_string_where_a_number_was_is_rejected_even_if_it_parses() -> None:
    err = rejection(fixed_decoder(),
                    encode_ipc_stream(table(v_sum=pa.array(["0.5", "1.5", "2.5"]))))
    assert err.reason == "schema-mismatch"
    assert "'v_sum'" in err.detail


def test_a_widened_integer_that_overflowed_before_is_accepted() -> None:
    dec = decoder()
    dec.decode(encode_ipc_stream(table(n_count=pa.array([0, 1, 2], pa.int32()))), None)
    wide = table(n_count=pa.array([0, 1, 2**40], pa.int64()))
    assert dec.decode(encode_ipc_stream(wide), None).table.column("n_count").to_pylist() == [
        0, 1, 2**40]


@pytest.mark.parametrize(
    ("name", "column", "expected"),
    [
        ("n_count", pa.array([0, 1, 2], pa.int8()), pa.array([0, 1, 2], pa.int64())),
        ("n_count", pa.array([0, 1, 2], pa.uint32()), pa.array([0, 1, 2], pa.int64())),
        ("v_sum", pa.array([0.5, 1.5, 2.5], pa.float32()), pa.array([0.5, 1.5, 2.5])),
        ("k", pa.array(["a", "b", "c"], pa.large_string()), pa.array(["a", "b", "c"])),
        ("ts", pa.array([0, 1_000, 2_000], pa.timestamp("s", "UTC")),
         pa.array([0, 1_000_000, 2_000_000], pa.timestamp("ms", "UTC"))),
    ],
)
def test_castable_type_is_accepted_and_cast(name: str, column: pa.Array,
                                            expected: pa.Array) -> None:
    decoded = fixed_decoder().decode(encode_ipc_stream(table(**{name: column})), None)
    assert decoded.table.schema == SCHEMA.remove(SCHEMA.get_field_index("flag"))
    assert decoded.table.column(name).combine_chunks().equals(expected)


@pytest.mark.parametrize(
    ("name", "column"),
    [
        ("v_sum", pa.array([[1.0], [2.0], [3.0]])),
        ("v_sum", pa.array([{"a": 1}, {"a": 2}, {"a": 3}])),
        ("v_sum", pa.array(["x", "y", "z"])),
        ("n_count", pa.array([0.5, 1.0, 2.0])),  # would truncate
        ("n_count", pa.array([0, 1, 2**63], pa.uint64())),  # out of range
        ("ts", pa.array([1, 2, 3], pa.timestamp("us", "UTC"))),  # sub-millisecond
    ],
)
def test_uncastable_type_is_a_schema_mismatch(name: str, column: pa.Array) -> None:
    err = rejection(fixed_decoder(), encode_ipc_stream(table(**{name: column})))
    assert err.reason == "schema-mismatch"
    assert f"{name!r}" in err.detail or "do not fit the plan's types" in err.detail


# -- rejected input ----------------------------------------------------------------------


def test_null_event_time_is_rejected() -> None:
    ts = pa.array([1_000, None, None], pa.timestamp("ms", "UTC"))
    err = rejection(fixed_decoder(), encode_ipc_stream(table(ts=ts)))
    assert err.reason == "null-event-time"
    assert err.detail == "2 rows have no 'ts'"


def test_null_event_time_in_the_first_message_is_rejected() -> None:
    ts = pa.array([None, 1, 2], pa.timestamp("ms", "UTC"))
    assert rejection(decoder(), encode_ipc_stream(table(ts=ts))).reason == "null-event-time"


def test_oversized_message_is_rejected_before_decoding() -> None:
    value = encode_ipc_stream(table(100))
    dec = decoder(max_message_bytes=len(value) - 1)
    err = rejection(dec, value)
    assert err.reason == "too-many-bytes"
    assert str(len(value)) in err.detail
    assert dec.plan is None
    assert decoder(max_message_bytes=len(value)).decode(value, None).table.num_rows == 100


def test_too_many_rows_is_rejected() -> None:
    err = rejection(decoder(limits=DecodeLimits(max_rows=2)), encode_ipc_stream(table(3)))
    assert err.reason == "too-many-rows"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "empty-stream"),
        (b"", "empty-stream"),
        (b"hello, not arrow at all", "not-arrow-ipc"),
        (b"\xff\xff\xff\xff\x10\x00\x00\x00garbage-garbage", "invalid-ipc"),
    ],
)
def test_garbage_gets_a_wire_reason(value: bytes | None, reason: str) -> None:
    dec = decoder()
    assert rejection(dec, value).reason == reason
    assert dec.plan is None


def test_truncated_stream_gets_a_wire_reason() -> None:
    value = encode_ipc_stream(table(50))
    assert rejection(decoder(), value[: len(value) // 2]).reason == "invalid-ipc"


def test_trailing_bytes_are_rejected() -> None:
    value = encode_ipc_stream(table())
    assert rejection(decoder(), value + value).reason == "trailing-bytes"


def test_bad_header_is_rejected() -> None:
    value = encode_ipc_stream(table())
    err = rejection(decoder(), value, [("content-type", b"application/json")])
    assert err.reason == "bad-header"


def test_arrow_content_type_header_is_accepted() -> None:
    value = encode_ipc_stream(table(), compression="zstd")
    decoded = decoder().decode(value, {"content-type": CONTENT_TYPE, "other": None})
    assert decoded.table.num_rows == 3


def test_empty_table_has_no_event_time() -> None:
    decoded = fixed_decoder().decode(encode_ipc_stream(table(0)), None)
    assert decoded.table.num_rows == 0
    assert decoded.max_event_ms is None


# -- event time --------------------------------------------------------------------------


def event_decoder(ts: pa.Array) -> Decoder:
    schema = pa.schema([("k", pa.string()), ("ts", ts.type), ("v_sum", pa.float64())])
    decoder = Decoder(make_plan, limits=DecodeLimits(), max_message_bytes=1 << 20)
    decoder.pin(schema, "a test")
    return decoder


def event_table(ts: pa.Array) -> pa.Table:
    return pa.table({"k": ["a"] * len(ts), "ts": ts, "v_sum": [1.0] * len(ts)})


@pytest.mark.parametrize(
    ("unit", "values", "expected"),
    [
        ("s", [5, -3, 1_700_000_000], 1_700_000_000_000),
        ("s", [-3, -7], -3_000),
        ("ms", [1_500, -20, 1_499], 1_500),
        ("ms", [-1_500], -1_500),
        ("us", [1_999_999, 2_000], 1_999),
        ("us", [-1_500], -2),  # floored, not truncated towards zero
        ("us", [-1_000], -1),
        ("ns", [2_500_000_001, 5], 2_500),
        ("ns", [-1], -1),
        ("ns", [-1_000_001], -2),
    ],
)
def test_max_event_ms_for_each_timestamp_unit(unit: str, values: list[int],
                                              expected: int) -> None:
    ts = pa.array(values, pa.timestamp(unit, "UTC"))
    dec = decoder()
    decoded = dec.decode(encode_ipc_stream(event_table(ts)), None)
    assert decoded.max_event_ms == expected
    # Polars has no seconds unit: it reads timestamp[s] as milliseconds.
    assert dec.time_dtype() == POLARS_TIMESTAMP[unit]


def test_max_event_ms_of_a_naive_timestamp() -> None:
    ts = pa.array([10, 20_000], pa.timestamp("us"))
    decoded = decoder().decode(encode_ipc_stream(event_table(ts)), None)
    assert decoded.max_event_ms == 20


@pytest.mark.parametrize("dtype", [pa.int64(), pa.int32(), pa.uint16()])
def test_max_event_ms_of_integer_epoch_ms(dtype: pa.DataType) -> None:
    ts = pa.array([5, 42, 7], dtype)
    dec = event_decoder(ts)
    assert dec.decode(encode_ipc_stream(event_table(ts)), None).max_event_ms == 42


def test_max_event_ms_of_negative_integer_epoch_ms() -> None:
    ts = pa.array([-5, -42], pa.int64())
    dec = event_decoder(ts)
    assert dec.decode(encode_ipc_stream(event_table(ts)), None).max_event_ms == -5
    assert dec.time_dtype() == pl.Int64()


def test_out_of_range_unsigned_event_time_is_rejected_not_a_crash() -> None:
    # A uint64 time column is accepted by the plan, but a value of 2**63 or more is no
    # epoch millisecond: the message must be rejected with a reason, never crash.
    ts = pa.array([1, 2**63 + 5], pa.uint64())
    dec = event_decoder(ts)
    with pytest.raises(RejectedMessageError):
        dec.decode(encode_ipc_stream(event_table(ts)), None)


def test_a_schema_polars_refuses_is_rejected_not_a_crash() -> None:
    # Valid Arrow (pyarrow accepts any time zone string) that Polars cannot represent.
    dec = Decoder(derive_plan, limits=DecodeLimits(), max_message_bytes=1 << 20)
    odd = pa.table({"k": ["a"], "when": pa.array([1], pa.timestamp("ms", tz="UTX")),
                    "v_sum": [1.0]})
    with pytest.raises(RejectedMessageError) as info:
        dec.decode(encode_ipc_stream(odd), None)
    assert info.value.reason == "unsupported-type"
    assert dec.plan is None  # the next good message may still fix the plan


# -- one frame per poll --------------------------------------------------------------------

POLL_WORDS = ["a", None, "ü-long enough to live outside the view", "", "sensor-0001"]


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string()])
def test_a_poll_of_plain_strings_becomes_polars_strings(kind: pa.DataType) -> None:
    tables = [pa.table({"k": pa.array(POLL_WORDS[i:] + POLL_WORDS[:i], kind),
                        "n": pa.array(range(5), pa.int64())}) for i in range(3)]
    frame = poll_frame(tables)
    expected = pl.DataFrame({"k": [w for i in range(3) for w in POLL_WORDS[i:] + POLL_WORDS[:i]],
                             "n": [n for _ in range(3) for n in range(5)]})
    assert_frame_equal(frame, expected)
    assert frame.n_chunks() == 3  # the messages' buffers are used, not copied together


def test_a_poll_of_dictionaries_becomes_one_categorical() -> None:
    # Each message has its own dictionary, in its own order.
    tables = [pa.table({"k": pa.array(POLL_WORDS[i:] + POLL_WORDS[:i]).dictionary_encode()})
              for i in range(3)]
    frame = poll_frame(tables)
    assert frame.schema["k"] == pl.Categorical()
    expected = [w for i in range(3) for w in POLL_WORDS[i:] + POLL_WORDS[:i]]
    assert frame.get_column("k").cast(pl.String).to_list() == expected
