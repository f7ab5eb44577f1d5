"""Fuzzing the daemon's input path: mutated and arbitrary messages go through the Decoder
and, when accepted, on through the engine (window, aggregate, close) exactly as the run
loop feeds them. Every message is either aggregated or rejected with a known reason;
nothing else may happen (wire/input.py's own fuzz covers the IPC decoding alone)."""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumer.core.decode import DecodedMessage, Decoder, RejectedMessageError
from consumer.core.plan import AggregationPlan, derive_plan
from consumer.core.types import MessageRef
from consumer.core.windows.bounds import WindowSpec
from consumer.core.windows.time.engine import TimeWindowEngine
from tests.mutations import mutated
from wire.input import DecodeLimits, dictionary_keys, encode_ipc_stream

REASONS = {"empty-stream", "not-arrow-ipc", "invalid-ipc", "invalid-schema", "trailing-bytes",
           "too-many-rows", "too-many-bytes", "bad-header", "schema-mismatch",
           "null-event-time", "invalid-event-time", "unsupported-type"}
PARTITION = ("fuzz", 0)
FIXTURE_OK = [HealthCheck.function_scoped_fixture]  # the decoder is shared on purpose


def plan_for(schema: pa.Schema) -> AggregationPlan:
    return derive_plan(schema, time_column="ts")


def seed_table() -> pa.Table:
    return pa.table({
        "site": pa.array(["a", "ü", None, "a", "b\"q"]),
        "ts": pa.array([0, 999, 1_000, 5_000, -1_500], pa.timestamp("ms", "UTC")),
        "reading_sum": pa.array([1.5, None, -2.0, float("nan"), 0.0]),
        "reading_count": pa.array([1, 2, 3, None, 5], pa.int32()),
        "reading_min": pa.array([0.5, -1.0, 2.0, 3.0, None]),
        "reading_max": pa.array([9, 8, 7, 6, 5], pa.uint16()),
    })


SEEDS = [encode_ipc_stream(seed_table(), c) for c in ("none", "zstd", "lz4")]
SEEDS.append(encode_ipc_stream(dictionary_keys(seed_table())))


def fresh_decoder() -> Decoder:
    decoder = Decoder(plan_for, limits=DecodeLimits(max_rows=10_000, max_decoded_bytes=1 << 22),
                      max_message_bytes=1 << 20)
    decoder.decode(SEEDS[0], None)  # the first valid message fixes the plan
    return decoder


def through_the_daemon(decoder: Decoder, value: bytes, offset: int) -> None:
    """Decode ``value``; an accepted message must window, aggregate and close cleanly."""
    try:
        decoded = decoder.decode(value, None)
    except RejectedMessageError as err:
        rejected = err
    else:
        aggregate(decoder, decoded, offset)
        return
    assert rejected.reason in REASONS, rejected
    assert "\n" not in str(rejected)


def aggregate(decoder: Decoder, decoded: DecodedMessage, offset: int) -> None:
    assert decoder.plan is not None
    engine = TimeWindowEngine(decoder.plan, WindowSpec.tumbling(1_000), event_time=True,
                              time_dtype=decoder.time_dtype(), allowed_lateness_ms=0,
                              idle_timeout_ms=1, merge_every=1)
    engine.assign(PARTITION, None, None, now_ms=0)
    frame = pl.from_arrow(decoded.table, rechunk=False)
    assert isinstance(frame, pl.DataFrame)
    ref = MessageRef(PARTITION, offset, decoded.table.num_rows, decoded.min_event_ms,
                     decoded.max_event_ms)
    assert engine.add(frame, [ref], now_ms=0) is None
    closed = engine.close_due(now_ms=10)  # idle: everything closes
    assert sum(w.input_rows for w in closed) == decoded.table.num_rows


@pytest.fixture(scope="module")
def decoder() -> Decoder:
    return fresh_decoder()


def test_every_seed_goes_through(decoder: Decoder) -> None:
    for offset, seed in enumerate(SEEDS):
        through_the_daemon(decoder, seed, offset)


@settings(suppress_health_check=FIXTURE_OK)
@given(seed=st.sampled_from(SEEDS), data=st.data())
def test_mutated_messages_are_aggregated_or_rejected(decoder: Decoder, seed: bytes,
                                                     data: st.DataObject) -> None:
    through_the_daemon(decoder, mutated(seed, data), 1)


@settings(suppress_health_check=FIXTURE_OK)
@given(columns=st.dictionaries(
    st.sampled_from(["site", "ts", "reading_sum", "reading_count", "reading_min", "extra"]),
    st.sampled_from([pa.int8(), pa.int64(), pa.uint64(), pa.float32(), pa.string(),
                     pa.large_string(), pa.timestamp("s"), pa.timestamp("ns", "UTC"),
                     pa.bool_(), pa.null(), pa.binary()]),
    min_size=1), rows=st.integers(0, 4))
def test_any_schema_is_aggregated_or_rejected(decoder: Decoder, columns: dict[str, pa.DataType],
                                              rows: int) -> None:
    arrays = {name: pa.nulls(rows, kind) if rows and name == "extra" else
              pa.array([None] * rows, kind) if kind == pa.null() else
              pa.array([], kind) if rows == 0 else _values(kind, rows)
              for name, kind in columns.items()}
    through_the_daemon(decoder, encode_ipc_stream(pa.table(arrays)), 2)


def _values(kind: pa.DataType, rows: int) -> pa.Array:
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind):
        return pa.array([f"v{i}" for i in range(rows)]).cast(kind)
    if pa.types.is_boolean(kind):
        return pa.array([i % 2 == 0 for i in range(rows)])
    return pa.array(list(range(rows))).cast(kind)
