"""The output wire format: one window's results as Arrow IPC (or JSON lines) messages.

Written by the daemon's Emit step and read back by ``consumer tail`` and
``read_output``; docs/wire-format.md is its description for subscribers.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import polars as pl
import pyarrow as pa

from wire.errors import ArrowaggError
from wire.input import (
    CONTENT_TYPE,
    HEADER_CHUNK,
    HEADER_CONTENT_TYPE,
    Compression,
    Headers,
    WireFormatError,
    decode_ipc_stream,
    encode_for_size,
)

CONTENT_TYPE_JSON = "application/x-ndjson"
HEADER_WINDOW_START = "arrowagg.window-start"
HEADER_WINDOW_END = "arrowagg.window-end"
HEADER_FINAL = "arrowagg.final"
HEADER_REVISION = "arrowagg.revision"
HEADER_WINDOW_ROWS = "arrowagg.window-rows"

OutputFormat = Literal["arrow", "json"]


class OutputFormatError(ArrowaggError):
    """An output-topic message that is not in arrowagg's output format."""


@dataclass(frozen=True)
class OutputMessage:
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]


@dataclass(frozen=True)
class OutputWindow:
    """One decoded output message: a window's results, or one chunk of them."""

    start_ms: int
    end_ms: int
    final: bool
    revision: int
    window_rows: int
    chunk: tuple[int, int]
    frame: pl.DataFrame


def encode_window(
    frame: pl.DataFrame, *, start_ms: int, end_ms: int, input_rows: int, fmt: OutputFormat,
    compression: Compression, max_bytes: int, revision: int = 0, final: bool = True,
) -> list[OutputMessage]:
    """Encode one window's result ``frame`` (window_start, window_end, keys, aggregates,
    row_count) into one or more messages of at most ``max_bytes``; ``input_rows`` is the
    number of input rows it aggregates."""
    if fmt == "arrow":
        # One chunk: a streaming group_by leaves a result in many, and each chunk of a
        # categorical column would carry (and compress) a dictionary of its own.
        values = encode_for_size(frame.rechunk().to_arrow(), max_bytes=max_bytes,
                                 compression=compression)
        content_type = CONTENT_TYPE
    else:
        values = _ndjson_chunks(frame, max_bytes)
        content_type = CONTENT_TYPE_JSON
    base = [
        (HEADER_CONTENT_TYPE, content_type.encode()),
        (HEADER_WINDOW_START, str(start_ms).encode()),
        (HEADER_WINDOW_END, str(end_ms).encode()),
        (HEADER_FINAL, b"true" if final else b"false"),
        (HEADER_REVISION, str(revision).encode()),
        (HEADER_WINDOW_ROWS, str(input_rows).encode()),
    ]
    key = str(start_ms).encode()
    return [
        OutputMessage(key, value, [*base, (HEADER_CHUNK, f"{i}/{len(values)}".encode())])
        for i, value in enumerate(values, start=1)
    ]


def _ndjson_chunks(frame: pl.DataFrame, max_bytes: int) -> list[bytes]:
    text = _json_ready(frame).write_ndjson().encode()
    if len(text) <= max_bytes:
        return [text]
    chunks: list[bytes] = []
    current = bytearray()
    for line in text.splitlines(keepends=True):
        if current and len(current) + len(line) > max_bytes:
            chunks.append(bytes(current))
            current = bytearray()
        current += line
    chunks.append(bytes(current))
    return chunks


def _json_ready(frame: pl.DataFrame) -> pl.DataFrame:
    """Timestamps as ISO-8601 UTC strings, the form JSON subscribers expect."""
    stamps = [
        pl.col(name).dt.convert_time_zone("UTC").dt.strftime("%Y-%m-%dT%H:%M:%S%.3fZ")
        if dtype.time_zone is not None
        else pl.col(name).dt.strftime("%Y-%m-%dT%H:%M:%S%.3f")
        for name, dtype in frame.schema.items() if isinstance(dtype, pl.Datetime)
    ]
    return frame.with_columns(stamps) if stamps else frame


def decode_output(value: bytes | None, headers: Headers) -> OutputWindow:
    """Decode one output message (Arrow or JSON lines) into an ``OutputWindow``."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers or []
    found = {name: raw.decode(errors="replace") if isinstance(raw, bytes) else raw or ""
             for name, raw in pairs}
    try:
        start = int(found[HEADER_WINDOW_START])
        end = int(found[HEADER_WINDOW_END])
        chunk_no, _, chunks = found.get(HEADER_CHUNK, "1/1").partition("/")
        meta = (found.get(HEADER_FINAL) == "true", int(found.get(HEADER_REVISION, "0")),
                int(found.get(HEADER_WINDOW_ROWS, "0")), (int(chunk_no), int(chunks)))
    except KeyError as err:
        raise OutputFormatError(f"no {err.args[0]} header") from err
    except ValueError as err:
        raise OutputFormatError(f"a header that is not a number ({err})") from err
    try:
        if found.get(HEADER_CONTENT_TYPE) == CONTENT_TYPE_JSON:
            frame = pl.read_ndjson(io.BytesIO(value or b""))
        else:
            table = decode_ipc_stream(value)
            frame = pl.DataFrame(pa.Table.from_batches(table.to_batches(), table.schema))
    except (WireFormatError, pl.exceptions.PolarsError) as err:
        detail = " ".join(str(err).split())[:200]
        raise OutputFormatError(f"its value is not a window's results: {detail}") from err
    return OutputWindow(start, end, *meta, frame=frame)
