from __future__ import annotations

import struct
from datetime import UTC, datetime
from typing import get_args

import polars as pl
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from tests.mutations import mutated
from wire.input import (
    CONTENT_TYPE,
    HEADER_CHUNK,
    HEADER_CONTENT_TYPE,
    HEADER_PRODUCER_ID,
    HEADER_SCHEMA_FINGERPRINT,
    HEADER_SEQUENCE,
    Compression,
    DecodeLimits,
    WireFormatError,
    WireHeaders,
    decode_ipc_stream,
    dictionary_keys,
    encode_for_size,
    encode_ipc_stream,
    message_headers,
    parse_headers,
    schema_fingerprint,
)

COMPRESSIONS: tuple[Compression, ...] = get_args(Compression)


def varied_table() -> pa.Table:
    """Unicode, quotes, spaces in names, nulls, NaN, timestamps, nested and dictionary."""
    return pa.table({
        "site name": pa.array(["\u03b1-1", 'say "hi"', None, "tab\there", "🙂", ""], pa.string()),
        "it's": pa.array([1, None, 3, -4, 2**62, 0], pa.int64()),
        "value": pa.array([0.5, float("nan"), None, -1e300, 3.0, 0.0], pa.float64()),
        "ts": pa.array([datetime(2025, 1, 1, tzinfo=UTC)] * 5 + [None],
                       pa.timestamp("ms", tz="UTC")),
        "naive_us": pa.array([1, 2, 3, None, 5, 6], pa.timestamp("us")),
        "flag": pa.array([True, False, None, True, True, False]),
        "tags": pa.array([["a"], [], None, ["b", "c"], ["d"], ["e"]], pa.list_(pa.string())),
        "kind": pa.array(["x", "y", "x", None, "y", "x"]).dictionary_encode(),
        "big": pa.array(["l"] * 6, pa.large_string()),
    })


def as_frame(table: pa.Table) -> pl.DataFrame:
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame


def reason_of(value: bytes | None, limits: DecodeLimits | None = None) -> str:
    with pytest.raises(WireFormatError) as caught:
        decode_ipc_stream(value) if limits is None else decode_ipc_stream(value, limits)
    assert "\n" not in str(caught.value)
    return caught.value.reason


def split_or_error(
    table: pa.Table, max_bytes: int, compression: Compression
) -> list[bytes] | WireFormatError:
    try:
        return encode_for_size(table, max_bytes=max_bytes, compression=compression)
    except WireFormatError as err:
        return err


def decode_or_error(value: bytes, limits: DecodeLimits | None = None) -> pa.Table | WireFormatError:
    try:
        return decode_ipc_stream(value) if limits is None else decode_ipc_stream(value, limits)
    except WireFormatError as err:
        return err


def stream_of(*batches: pa.RecordBatch, eos: bool = True) -> bytes:
    sink = pa.BufferOutputStream()
    writer = pa.ipc.new_stream(sink, batches[0].schema)
    for batch in batches:
        writer.write_batch(batch)
    if eos:
        writer.close()
    return bytes(sink.getvalue().to_pybytes())


# --- encoding and decoding -------------------------------------------------------------


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_round_trip_keeps_schema_and_values(compression: Compression) -> None:
    table = varied_table()
    decoded = decode_ipc_stream(encode_ipc_stream(table, compression))
    assert decoded.schema == table.schema
    assert_frame_equal(as_frame(decoded), as_frame(table))


def test_a_record_batch_encodes_like_its_table() -> None:
    batch = varied_table().to_batches()[0]
    decoded = decode_ipc_stream(encode_ipc_stream(batch, "zstd"))
    assert_frame_equal(as_frame(decoded), as_frame(pa.Table.from_batches([batch])))


def test_compression_shrinks_repetitive_data() -> None:
    table = pa.table({"s": pa.array(["the same words again"] * 5_000)})
    plain = len(encode_ipc_stream(table))
    assert len(encode_ipc_stream(table, "lz4")) < plain / 4
    assert len(encode_ipc_stream(table, "zstd")) < plain / 4


def test_a_stream_without_rows_decodes_to_an_empty_table_with_its_schema() -> None:
    schema = pa.schema([("a", pa.int64()), ("b", pa.string())])
    decoded = decode_ipc_stream(encode_ipc_stream(schema.empty_table()))
    assert decoded.num_rows == 0
    assert decoded.schema == schema


def test_what_plain_pyarrow_workers_send_is_accepted() -> None:
    table = varied_table()
    batch = table.to_batches()[0]
    without_eos = stream_of(batch, eos=False)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    feather = bytes(sink.getvalue().to_pybytes())
    legacy_sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(use_legacy_format=True)
    with pa.ipc.new_stream(legacy_sink, table.schema, options=options) as writer:
        writer.write_table(table)
    legacy = bytes(legacy_sink.getvalue().to_pybytes())
    for value in (without_eos, feather, legacy):
        assert_frame_equal(as_frame(decode_ipc_stream(value)), as_frame(table))


def test_several_batches_decode_in_order() -> None:
    first, second = pa.record_batch({"a": [1, 2]}), pa.record_batch({"a": [3]})
    decoded = decode_ipc_stream(stream_of(first, second))
    assert_frame_equal(as_frame(decoded), pl.DataFrame({"a": [1, 2, 3]}))


# --- splitting -------------------------------------------------------------------------


def table_of(rows: int) -> pa.Table:
    words = [f"row {i} " + "x" * (i % 37) for i in range(rows)]
    return pa.table({"id": pa.array(range(rows), pa.int64()), "word": pa.array(words)})


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.integers(0, 3_000), max_bytes=st.integers(600, 60_000),
       compression=st.sampled_from(COMPRESSIONS))
def test_encode_for_size_fits_and_keeps_every_row(
    rows: int, max_bytes: int, compression: Compression
) -> None:
    table = table_of(rows)
    streams = split_or_error(table, max_bytes, compression)
    if isinstance(streams, WireFormatError):
        assert streams.reason == "too-many-bytes"
        largest_row = max(len(encode_ipc_stream(table.slice(i, 1), compression))
                          for i in range(rows))
        assert largest_row > max_bytes  # raising is allowed only when one row cannot fit
        return
    assert all(len(stream) <= max_bytes for stream in streams)
    if rows == 0:
        assert streams == []
        return
    decoded = pa.concat_tables([decode_ipc_stream(stream) for stream in streams])
    assert_frame_equal(as_frame(decoded), as_frame(table))


def test_a_table_that_fits_is_one_stream() -> None:
    table = table_of(100)
    assert encode_for_size(table, max_bytes=1_000_000) == [encode_ipc_stream(table)]


def test_a_big_table_splits_into_streams_near_the_limit() -> None:
    table = table_of(50_000)
    streams = encode_for_size(table, max_bytes=100_000, compression="lz4")
    assert len(streams) > 1
    assert all(len(stream) <= 100_000 for stream in streams)
    # The estimate should fill messages well, not halve them down to slivers.
    assert sum(map(len, streams)) / len(streams) > 50_000


def test_a_view_column_splits_although_slices_share_its_buffers() -> None:
    words = pa.array([f"word number {i}" for i in range(20_000)], pa.string_view())
    table = pa.table({"w": words})
    streams = encode_for_size(table, max_bytes=20_000)
    decoded = pa.concat_tables([decode_ipc_stream(stream) for stream in streams])
    assert decoded.schema == table.schema
    assert_frame_equal(as_frame(decoded), as_frame(table))


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_a_dictionary_column_splits_with_each_piece_holding_its_own_values(
    compression: Compression,
) -> None:
    # A slice of a dictionary column keeps the whole dictionary; written as it is, every
    # piece would carry all 20,000 words and none could fit.
    words = pa.array([f"word number {i}" for i in range(20_000)]).dictionary_encode()
    table = pa.table({"w": words, "n": pa.array(range(20_000), pa.int64())})
    streams = encode_for_size(table, max_bytes=30_000, compression=compression)
    assert len(streams) > 2
    assert all(len(stream) <= 30_000 for stream in streams)
    pieces = [decode_ipc_stream(stream) for stream in streams]
    for piece in pieces:
        column = piece.column("w").combine_chunks()
        assert len(column.dictionary) == len(column)
    decoded = pa.concat_tables(pieces)
    assert decoded.schema == table.schema
    assert_frame_equal(as_frame(decoded), as_frame(table))


def test_dictionary_keys_encode_every_plain_string_column() -> None:
    table = pa.table({"a": pa.array(["x", "y", "x"]),
                      "b": pa.array(["p", None, "p"], pa.large_string()),
                      "c": pa.array(["q", "q", "r"], pa.string_view()), "n": [1, 2, 3]})
    encoded = dictionary_keys(table)
    assert [pa.types.is_dictionary(f.type) for f in encoded.schema] == [True, True, True, False]
    assert_frame_equal(as_frame(encoded).with_columns(pl.col("a", "b", "c").cast(pl.String)),
                       as_frame(table))


def test_a_single_row_too_big_for_a_message_raises() -> None:
    table = pa.table({"blob": pa.array(["small", "y" * 50_000, "small"])})
    with pytest.raises(WireFormatError) as caught:
        encode_for_size(table, max_bytes=10_000)
    assert caught.value.reason == "too-many-bytes"
    assert "row 1 alone" in str(caught.value)


def test_max_bytes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        encode_for_size(table_of(3), max_bytes=0)


# --- fingerprint -----------------------------------------------------------------------


def test_fingerprint_is_stable_across_runs_and_versions() -> None:
    schema = pa.schema([("a", pa.int64()), ("b", pa.string())])
    assert schema_fingerprint(schema) == "8f7cc4ef7291064bcf320ad193a9735c"


def test_fingerprint_ignores_schema_and_field_metadata() -> None:
    schema = varied_table().schema
    annotated = pa.schema(
        [field.with_metadata({"pandas": "x"}) for field in schema], metadata={"origin": "polars"}
    )
    assert schema_fingerprint(annotated) == schema_fingerprint(schema)


@pytest.mark.parametrize("changed", [
    pa.schema([("a", pa.int32()), ("b", pa.string())]),
    pa.schema([("a", pa.int64()), ("b", pa.large_string())]),
    pa.schema([pa.field("a", pa.int64(), nullable=False), ("b", pa.string())]),
    pa.schema([("A", pa.int64()), ("b", pa.string())]),
    pa.schema([("b", pa.string()), ("a", pa.int64())]),
    pa.schema([("a", pa.int64())]),
])
def test_fingerprint_changes_with_names_types_nullability_and_order(changed: pa.Schema) -> None:
    base = pa.schema([("a", pa.int64()), ("b", pa.string())])
    assert schema_fingerprint(changed) != schema_fingerprint(base)


def test_fingerprint_tells_time_zones_and_units_apart() -> None:
    prints = {
        schema_fingerprint(pa.schema([("ts", kind)]))
        for kind in (pa.timestamp("ms"), pa.timestamp("ms", tz="UTC"), pa.timestamp("us", tz="UTC"))
    }
    assert len(prints) == 3


# --- rejection of bad input ------------------------------------------------------------


@pytest.mark.parametrize("value", [None, b""])
def test_no_value_is_an_empty_stream(value: bytes | None) -> None:
    assert reason_of(value) == "empty-stream"


@pytest.mark.parametrize("value", [b"hello world", b'{"site": "a"}', b"\x00" * 64, b"PAR1...."])
def test_other_formats_are_not_arrow_ipc(value: bytes) -> None:
    assert reason_of(value) == "not-arrow-ipc"


def test_a_stream_cut_inside_a_message_is_invalid() -> None:
    value = encode_ipc_stream(varied_table())
    assert reason_of(value[: len(value) - 40]) == "invalid-ipc"
    assert reason_of(value[:12]) == "invalid-ipc"


def test_every_truncation_is_rejected_or_a_prefix_of_the_rows() -> None:
    batches = [pa.record_batch({"a": [i, i + 1], "s": ["p", "q"]}) for i in range(0, 6, 2)]
    value = stream_of(*batches)
    full = as_frame(pa.Table.from_batches(batches))
    for cut in range(1, len(value)):
        decoded = decode_or_error(value[:cut])
        if isinstance(decoded, WireFormatError):
            assert decoded.reason in {"invalid-ipc", "not-arrow-ipc"}
            continue
        # Cut exactly between messages: indistinguishable from a shorter stream.
        assert_frame_equal(as_frame(decoded), full.head(decoded.num_rows))


def test_two_concatenated_streams_are_trailing_bytes() -> None:
    value = encode_ipc_stream(table_of(3))
    assert reason_of(value + value) == "trailing-bytes"


def strings_from_buffers(offsets: list[int], data: bytes) -> pa.Table:
    """A string column built straight from buffers, past pyarrow's full validation."""
    offset_buffer = pa.array(offsets, pa.int32()).buffers()[1]
    column = pa.Array.from_buffers(pa.string(), len(offsets) - 1,
                                   [None, offset_buffer, pa.py_buffer(data)])
    return pa.table({"s": column})


@pytest.mark.parametrize(("offsets", "data"), [
    ([0, 2, 4], b"\xff\xfeok"),  # invalid UTF-8
    ([0, 3, 2], b"okok"),  # non-monotonic offsets
])
def test_corrupt_strings_that_a_plain_read_accepts_are_invalid(
    offsets: list[int], data: bytes
) -> None:
    value = encode_ipc_stream(strings_from_buffers(offsets, data))
    assert pa.ipc.open_stream(value).read_all().num_rows == 2  # pyarrow alone lets it pass
    assert reason_of(value) == "invalid-ipc"


def test_string_offsets_pointing_past_the_data_are_invalid() -> None:
    value = bytearray(encode_ipc_stream(pa.table({"s": ["ab", "cd"]})))
    offsets = bytes(pa.array([0, 2, 4], pa.int32()).buffers()[1])
    at = value.index(offsets)
    value[at + 8 : at + 12] = struct.pack("<i", 400)
    assert pa.ipc.open_stream(bytes(value)).read_all().num_rows == 2
    assert reason_of(bytes(value)) == "invalid-ipc"


def test_a_field_name_that_is_not_utf8_is_invalid() -> None:
    value = bytearray(encode_ipc_stream(pa.table({"temperature": [1.0]})))
    at = value.index(b"temperature")
    value[at : at + 2] = b"\xff\xfe"
    assert reason_of(bytes(value)) == "invalid-ipc"


def test_a_time_zone_that_is_not_utf8_is_invalid() -> None:
    value = bytearray(encode_ipc_stream(pa.table({"ts": pa.array([0], pa.timestamp("ms", "UTC"))})))
    at = value.index(b"UTC")
    value[at : at + 1] = b"\xcc"
    assert reason_of(bytes(value)) == "invalid-ipc"


def test_repeated_column_names_are_an_invalid_schema() -> None:
    table = pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["site", "site"])
    assert reason_of(encode_ipc_stream(table)) == "invalid-schema"


def test_dictionary_indices_out_of_range_are_invalid() -> None:
    column = pa.DictionaryArray.from_arrays(pa.array([0, 5], pa.int32()), pa.array(["a"]),
                                            safe=False)
    assert reason_of(encode_ipc_stream(pa.table({"d": column}))) == "invalid-ipc"


# --- limits ----------------------------------------------------------------------------


def test_row_limit_counts_across_batches() -> None:
    value = stream_of(*[pa.record_batch({"a": list(range(5))})] * 3)
    assert decode_ipc_stream(value, DecodeLimits(max_rows=15)).num_rows == 15
    assert reason_of(value, DecodeLimits(max_rows=14)) == "too-many-rows"


def test_byte_limit_counts_decoded_buffers() -> None:
    value = encode_ipc_stream(pa.table({"a": pa.array(range(10_000), pa.int64())}))
    assert decode_ipc_stream(value, DecodeLimits(max_decoded_bytes=80_000)).num_rows == 10_000
    assert reason_of(value, DecodeLimits(max_decoded_bytes=79_999)) == "too-many-bytes"


def test_a_decompression_bomb_is_stopped_by_its_declared_size() -> None:
    zeros = pa.table({"z": pa.array([0] * 2_000_000, pa.int64())})
    value = encode_ipc_stream(zeros, "zstd")
    assert len(value) < 20_000  # 16 MB of zeros shrink to almost nothing
    assert reason_of(value, DecodeLimits(max_decoded_bytes=1 << 20)) == "too-many-bytes"


def test_a_forged_uncompressed_length_is_refused_before_allocating() -> None:
    value = bytearray(encode_ipc_stream(pa.table({"a": pa.array(range(1000), pa.int64())}), "lz4"))
    at = value.index(struct.pack("<q", 8000))  # the data buffer's uncompressed-length prefix
    value[at : at + 8] = struct.pack("<q", 1 << 50)
    assert reason_of(bytes(value)) == "too-many-bytes"


# --- headers ---------------------------------------------------------------------------


def test_headers_round_trip() -> None:
    headers = message_headers(fingerprint="ab" * 16, producer_id="worker-7 ✓", sequence=41,
                              chunk=(2, 3))
    assert parse_headers(headers) == WireHeaders(
        content_type=CONTENT_TYPE, schema_fingerprint="ab" * 16, producer_id="worker-7 ✓",
        sequence=41, chunk=(2, 3),
    )


def test_an_unsplit_message_has_no_chunk_header() -> None:
    headers = message_headers(fingerprint="f", producer_id="p", sequence=0)
    assert [name for name, _ in headers] == [
        HEADER_CONTENT_TYPE, HEADER_SCHEMA_FINGERPRINT, HEADER_PRODUCER_ID, HEADER_SEQUENCE,
    ]


@pytest.mark.parametrize("headers", [None, [], [("unrelated", b"x")], [(HEADER_SEQUENCE, None)]])
def test_absent_headers_are_fine(headers: list[tuple[str, bytes | None]] | None) -> None:
    assert parse_headers(headers) == WireHeaders(None, None, None, None, None)


def test_header_names_ignore_case_text_values_are_accepted_and_the_last_wins() -> None:
    parsed = parse_headers([
        ("Content-Type", "application/vnd.apache.arrow.stream; charset=binary"),
        ("ARROWAGG.SEQUENCE", b"1"),
        ("arrowagg.sequence", "2"),
    ])
    assert parsed.sequence == 2
    assert parsed.content_type is not None


@pytest.mark.parametrize("header", [
    (HEADER_CONTENT_TYPE, b"application/json"),
    (HEADER_SEQUENCE, b"-1"),
    (HEADER_SEQUENCE, b"+1"),
    (HEADER_SEQUENCE, b" 1"),
    (HEADER_SEQUENCE, b"1.0"),
    (HEADER_SEQUENCE, b"1_000"),
    (HEADER_SEQUENCE, "\u0661".encode()),  # ARABIC-INDIC DIGIT ONE, which int() accepts
    (HEADER_SEQUENCE, b""),
    (HEADER_SEQUENCE, str(2**63).encode()),
    (HEADER_CHUNK, b"0/3"),
    (HEADER_CHUNK, b"4/3"),
    (HEADER_CHUNK, b"1/0"),
    (HEADER_CHUNK, b"1-3"),
    (HEADER_CHUNK, b"1/3/3"),
    (HEADER_CHUNK, b"a/b"),
    (HEADER_PRODUCER_ID, b"\xff\xfe"),
])
def test_malformed_headers_are_bad_header(header: tuple[str, bytes]) -> None:
    with pytest.raises(WireFormatError) as caught:
        parse_headers([header])
    assert caught.value.reason == "bad-header"


def test_the_largest_sequence_is_accepted() -> None:
    assert parse_headers([(HEADER_SEQUENCE, str(2**63 - 1).encode())]).sequence == 2**63 - 1


@pytest.mark.parametrize(("sequence", "chunk"), [(-1, None), (0, (0, 2)), (0, (3, 2))])
def test_message_headers_refuse_impossible_values(
    sequence: int, chunk: tuple[int, int] | None
) -> None:
    with pytest.raises(ValueError, match="must be"):
        message_headers(fingerprint="f", producer_id="p", sequence=sequence, chunk=chunk)


# --- fuzzing ---------------------------------------------------------------------------

REASONS = {"empty-stream", "not-arrow-ipc", "invalid-ipc", "invalid-schema", "trailing-bytes",
           "too-many-rows", "too-many-bytes"}
SEED_STREAMS = [encode_ipc_stream(varied_table(), compression) for compression in COMPRESSIONS]


def decodes_or_rejects(value: bytes) -> None:
    outcome = decode_or_error(value, DecodeLimits(max_decoded_bytes=1 << 24))
    if isinstance(outcome, WireFormatError):
        assert outcome.reason in REASONS
        assert "\n" not in str(outcome)
    else:
        assert isinstance(outcome, pa.Table)
        outcome.validate(full=True)
        assert str(outcome.schema)  # every name and type readable


@given(st.binary(max_size=2_000))
def test_arbitrary_bytes_decode_or_are_rejected(value: bytes) -> None:
    decodes_or_rejects(value)


@given(seed=st.sampled_from(SEED_STREAMS), data=st.data())
def test_mutated_streams_decode_or_are_rejected(seed: bytes, data: st.DataObject) -> None:
    decodes_or_rejects(mutated(seed, data))
