from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime

import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

from wire.input import (
    CONTENT_TYPE,
    HEADER_CHUNK,
    HEADER_CONTENT_TYPE,
    Compression,
    Headers,
    decode_ipc_stream,
)
from wire.output import (
    CONTENT_TYPE_JSON,
    HEADER_FINAL,
    HEADER_KEYS,
    HEADER_REVISION,
    HEADER_REVISION_KIND,
    HEADER_WINDOW_END,
    HEADER_WINDOW_ROWS,
    HEADER_WINDOW_START,
    OutputFormat,
    OutputFormatError,
    OutputMessage,
    decode_output,
    encode_window,
)

UTC_MS = pl.Datetime("ms", "UTC")
START_MS = 1_700_000_000_000
END_MS = START_MS + 60_000
ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def result_frame(groups: int, start_ms: int = START_MS, end_ms: int = END_MS) -> pl.DataFrame:
    return pl.DataFrame({
        "window_start": [start_ms] * groups,
        "window_end": [end_ms] * groups,
        "k": [f"sensor-{i:04d}" for i in range(groups)],
        "v_sum": [i * 0.5 for i in range(groups)],
        "n_count": list(range(groups)),
        "v_max": [None if i % 7 == 0 else float(i) for i in range(groups)],
        "row_count": [i + 1 for i in range(groups)],
    }).with_columns(pl.col("window_start", "window_end").cast(UTC_MS))


@dataclass(frozen=True)
class Window:
    frame: pl.DataFrame
    start_ms: int
    end_ms: int
    input_rows: int


def closed_window(groups: int = 5) -> Window:
    frame = result_frame(groups)
    return Window(frame, START_MS, END_MS, int(frame["row_count"].sum()))


def encode(window: Window, *, fmt: OutputFormat, compression: Compression, max_bytes: int,
           revision: int = 0, final: bool = True) -> list[OutputMessage]:
    return encode_window(window.frame, start_ms=window.start_ms, end_ms=window.end_ms,
                         input_rows=window.input_rows, fmt=fmt, compression=compression,
                         max_bytes=max_bytes, revision=revision, final=final)


def headers_of(message: OutputMessage) -> dict[str, bytes]:
    names = [name for name, _ in message.headers]
    assert len(names) == len(set(names))
    return dict(message.headers)


def concat_decoded(messages: list[OutputMessage]) -> pl.DataFrame:
    return pl.concat([decode_output(m.value, m.headers).frame for m in messages])


# -- Arrow -------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
def test_arrow_round_trip(compression: Compression) -> None:
    window = closed_window()
    (message,) = encode(window, fmt="arrow", compression=compression,
                               max_bytes=1_000_000)
    decoded = decode_output(message.value, message.headers)
    assert_frame_equal(decoded.frame, window.frame)
    assert (decoded.start_ms, decoded.end_ms) == (START_MS, END_MS)
    assert decoded.final is True
    assert decoded.revision == 0
    assert decoded.window_rows == window.input_rows
    assert decoded.chunk == (1, 1)


def test_arrow_value_is_a_plain_arrow_ipc_stream() -> None:
    window = closed_window()
    (message,) = encode(window, fmt="arrow", compression="zstd", max_bytes=1_000_000)
    table = decode_ipc_stream(message.value)
    assert table.num_rows == 5
    assert_frame_equal(pl.DataFrame(table), window.frame)


def test_compression_makes_repetitive_results_smaller() -> None:
    window = closed_window(2_000)
    sizes = {
        compression: len(encode(window, fmt="arrow", compression=compression,
                                       max_bytes=10**8)[0].value)
        for compression in ("none", "lz4", "zstd")
    }
    assert sizes["zstd"] < sizes["none"]
    assert sizes["lz4"] < sizes["none"]


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_arrow_chunks_reassemble(compression: Compression) -> None:
    window = closed_window(400)
    messages = encode(window, fmt="arrow", compression=compression, max_bytes=2_500)
    count = len(messages)
    assert count > 2
    assert all(len(m.value) <= 2_500 for m in messages)
    chunks = [headers_of(m)[HEADER_CHUNK] for m in messages]
    assert chunks == [f"{i}/{count}".encode() for i in range(1, count + 1)]
    decoded = [decode_output(m.value, m.headers) for m in messages]
    assert [d.chunk for d in decoded] == [(i, count) for i in range(1, count + 1)]
    assert {d.window_rows for d in decoded} == {window.input_rows}
    assert_frame_equal(concat_decoded(messages), window.frame)


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
def test_categorical_keys_in_many_chunks_split_as_plain_strings(
    compression: Compression,
) -> None:
    """A streaming group_by leaves a window's result in many chunks; keys from dictionary
    input are categoricals. They go out as the output's plain strings, cut by rows."""
    groups = 6_000
    frame = result_frame(groups).with_columns(pl.col("k").cast(pl.Categorical))
    pieces = pl.concat([frame.slice(i, 500) for i in range(0, groups, 500)], rechunk=False)
    assert pieces.n_chunks() > 1
    window = Window(pieces, START_MS, END_MS, int(frame["row_count"].sum()))
    messages = encode(window, fmt="arrow", compression=compression, max_bytes=20_000)
    assert len(messages) > 2
    assert all(len(m.value) <= 20_000 for m in messages)
    for message in messages:
        assert decode_ipc_stream(message.value).schema.field("k").type == pa.large_string()
    assert_frame_equal(concat_decoded(messages), frame.with_columns(pl.col("k").cast(pl.String)))


# -- JSON lines --------------------------------------------------------------------------


def test_json_round_trip_with_iso_timestamps() -> None:
    window = closed_window()
    (message,) = encode(window, fmt="json", compression="zstd", max_bytes=1_000_000)
    assert headers_of(message)[HEADER_CONTENT_TYPE] == CONTENT_TYPE_JSON.encode()
    lines = message.value.decode().splitlines()
    assert len(lines) == 5
    first = json.loads(lines[0])
    assert first["window_start"] == "2023-11-14T22:13:20.000Z"
    assert first["window_end"] == "2023-11-14T22:14:20.000Z"
    assert first["k"] == "sensor-0000"
    assert first["v_max"] is None
    decoded = decode_output(message.value, message.headers)
    for column in ("window_start", "window_end"):
        assert all(ISO_UTC.fullmatch(text) for text in decoded.frame[column])
    parsed = decoded.frame.with_columns(
        pl.col("window_start", "window_end").str.to_datetime(
            "%Y-%m-%dT%H:%M:%S%.3fZ", time_unit="ms", time_zone="UTC")
    )
    assert_frame_equal(parsed, window.frame)
    assert (decoded.start_ms, decoded.end_ms, decoded.window_rows) == (
        START_MS, END_MS, window.input_rows)


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
def test_json_ignores_arrow_compression(compression: Compression) -> None:
    window = closed_window()
    (message,) = encode(window, fmt="json", compression=compression,
                               max_bytes=1_000_000)
    assert message.value.startswith(b'{"window_start":')


def test_json_timestamps_in_another_zone_are_written_in_utc() -> None:
    moment = datetime(2024, 3, 1, 12, 30, 15, 250_000, tzinfo=UTC)
    frame = result_frame(1).with_columns(
        first_seen=pl.lit(moment).cast(pl.Datetime("us", "UTC"))
        .dt.convert_time_zone("Europe/Paris"),
        naive=pl.lit(moment.replace(tzinfo=None)).cast(pl.Datetime("ms")),
    )
    window = Window(frame, START_MS, END_MS, 1)
    (message,) = encode(window, fmt="json", compression="none", max_bytes=1_000_000)
    line = json.loads(message.value)
    assert line["first_seen"] == "2024-03-01T12:30:15.250000Z"  # microseconds kept
    assert line["naive"] == "2024-03-01T12:30:15.250Z"  # read as UTC, as the windows read it


def test_json_chunks_split_between_lines() -> None:
    window = closed_window(300)
    messages = encode(window, fmt="json", compression="none", max_bytes=2_000)
    count = len(messages)
    assert count > 2
    assert all(len(m.value) <= 2_000 for m in messages)
    assert all(m.value.endswith(b"\n") for m in messages)
    assert [headers_of(m)[HEADER_CHUNK] for m in messages] == [
        f"{i}/{count}".encode() for i in range(1, count + 1)]
    whole = concat_decoded(messages).with_columns(
        pl.col("window_start", "window_end").str.to_datetime(
            "%Y-%m-%dT%H:%M:%S%.3fZ", time_unit="ms", time_zone="UTC")
    )
    assert_frame_equal(whole, window.frame)


# -- headers -----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["arrow", "json"])
def test_headers_carry_window_bounds_final_revision_and_rows(fmt: OutputFormat) -> None:
    window = closed_window()
    (message,) = encode(window, fmt=fmt, compression="none", max_bytes=1_000_000,
                               revision=3, final=False)
    assert message.key == str(START_MS).encode()
    headers = headers_of(message)
    assert headers[HEADER_CONTENT_TYPE] == (CONTENT_TYPE if fmt == "arrow"
                                            else CONTENT_TYPE_JSON).encode()
    assert headers[HEADER_WINDOW_START] == str(START_MS).encode()
    assert headers[HEADER_WINDOW_END] == str(END_MS).encode()
    assert headers[HEADER_FINAL] == b"false"
    assert headers[HEADER_REVISION] == b"3"
    assert headers[HEADER_WINDOW_ROWS] == str(window.input_rows).encode()
    assert headers[HEADER_CHUNK] == b"1/1"
    decoded = decode_output(message.value, message.headers)
    assert (decoded.final, decoded.revision) == (False, 3)


def test_every_chunk_has_the_same_key_and_window_headers() -> None:
    messages = encode(closed_window(400), fmt="arrow", compression="none",
                             max_bytes=4_000)
    assert {m.key for m in messages} == {str(START_MS).encode()}
    without_chunk = [[h for h in m.headers if h[0] != HEADER_CHUNK] for m in messages]
    assert all(h == without_chunk[0] for h in without_chunk)


def test_decode_accepts_headers_as_a_dict_of_text() -> None:
    window = closed_window()
    (message,) = encode(window, fmt="arrow", compression="lz4", max_bytes=1_000_000)
    as_text: dict[str, str | bytes | None] = {
        name: value.decode() for name, value in message.headers}
    decoded = decode_output(message.value, as_text)
    assert (decoded.start_ms, decoded.end_ms, decoded.chunk) == (START_MS, END_MS, (1, 1))
    assert_frame_equal(decoded.frame, window.frame)


def test_decode_defaults_for_absent_optional_headers() -> None:
    window = closed_window()
    (message,) = encode(window, fmt="arrow", compression="none", max_bytes=1_000_000)
    kept = [(n, v) for n, v in message.headers if n in (HEADER_WINDOW_START, HEADER_WINDOW_END)]
    decoded = decode_output(message.value, kept)
    assert (decoded.final, decoded.revision, decoded.window_rows, decoded.chunk) == (
        False, 0, 0, (1, 1))


@pytest.mark.parametrize(
    "headers",
    [
        None,
        [],
        {},
        [(HEADER_WINDOW_END, b"2")],
        [(HEADER_WINDOW_START, b"1")],
        [(HEADER_WINDOW_START, b"soon"), (HEADER_WINDOW_END, b"2")],
        [(HEADER_WINDOW_START, b"1"), (HEADER_WINDOW_END, b"2"), (HEADER_CHUNK, b"x/y")],
        [(HEADER_WINDOW_START, b"1"), (HEADER_WINDOW_END, b"2"), (HEADER_REVISION, b"r")],
    ],
)
def test_decode_without_window_headers_is_an_output_format_error(
    headers: Headers,
) -> None:
    (message,) = encode(closed_window(), fmt="arrow", compression="none",
                               max_bytes=1_000_000)
    with pytest.raises(OutputFormatError, match=r"^(no arrowagg\.window-\w+ header|a header "
                                                 r"that is not a number)"):
        decode_output(message.value, headers)


@pytest.mark.parametrize("content_type", [b"application/x-ndjson",
                                          b"application/vnd.apache.arrow.stream"])
def test_a_value_that_is_not_results_is_an_output_format_error(content_type: bytes) -> None:
    headers = [(HEADER_WINDOW_START, b"1"), (HEADER_WINDOW_END, b"2"),
               ("content-type", content_type)]
    with pytest.raises(OutputFormatError, match=r"^its value is not a window's results: "):
        decode_output(b"hello, world", headers)


@pytest.mark.parametrize("fmt", ["arrow", "json"])
def test_an_update_revision_says_its_kind_and_its_key_columns(fmt: OutputFormat) -> None:
    window = closed_window()
    (message,) = encode_window(window.frame, start_ms=START_MS, end_ms=END_MS,
                               input_rows=9, fmt=fmt, compression="none", max_bytes=1_000_000,
                               revision=2, kind="update", keys=["k", "zöne"])
    headers = headers_of(message)
    assert headers[HEADER_REVISION_KIND] == b"update"
    assert headers[HEADER_KEYS] == b'["k", "z\\u00f6ne"]'  # ASCII, as every header value
    decoded = decode_output(message.value, message.headers)
    assert (decoded.kind, decoded.keys, decoded.revision) == ("update", ("k", "zöne"), 2)


@pytest.mark.parametrize(("final", "revision", "kind"), [
    (True, 0, "full"), (False, 0, "delta"), (True, 2, "delta")])
def test_messages_without_a_kind_header_get_the_kind_they_had(
        final: bool, revision: int, kind: str) -> None:
    (message,) = encode(closed_window(), fmt="arrow", compression="none",
                        max_bytes=1_000_000, revision=revision, final=final)
    older = [(n, v) for n, v in message.headers if n != HEADER_REVISION_KIND]
    assert decode_output(message.value, older).kind == kind


@pytest.mark.parametrize(("headers", "says"), [
    ([(HEADER_REVISION_KIND, b"sideways")], "unknown arrowagg.revision-kind"),
    ([(HEADER_REVISION_KIND, b"update")], "without a valid arrowagg.keys"),
    ([(HEADER_REVISION_KIND, b"update"), (HEADER_KEYS, b'{"k": 1}')], "JSON array"),
])
def test_a_bad_revision_kind_is_an_output_format_error(
        headers: list[tuple[str, bytes]], says: str) -> None:
    (message,) = encode(closed_window(), fmt="arrow", compression="none", max_bytes=1_000_000)
    kept = [(n, v) for n, v in message.headers if n != HEADER_REVISION_KIND]
    with pytest.raises(OutputFormatError, match=says):
        decode_output(message.value, [*kept, *headers])


@pytest.mark.parametrize("key_type", [pl.Categorical(), pl.Enum([f"sensor-{i:04d}" for i in
                                                                 range(3)]), pl.String()])
def test_string_keys_are_always_plain_strings_in_the_output(key_type: pl.DataType) -> None:
    frame = result_frame(3).with_columns(pl.col("k").cast(key_type))
    (message,) = encode(Window(frame, START_MS, END_MS, 3), fmt="arrow", compression="none",
                        max_bytes=1_000_000)
    schema = decode_ipc_stream(message.value).schema
    assert schema.field("k").type == pa.large_string()
    assert schema.field("k").metadata is None
