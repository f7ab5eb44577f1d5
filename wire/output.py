"""The output wire format: one window's results as Arrow IPC (or JSON lines) messages.

Written by the daemon's Emit step and read back by ``consumer tail`` and
``read_output``; docs/wire-format.md is its description for subscribers.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
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
from wire.timestamps import rfc3339_columns

CONTENT_TYPE_JSON = "application/x-ndjson"
HEADER_WINDOW_START = "arrowagg.window-start"
HEADER_WINDOW_END = "arrowagg.window-end"
HEADER_FINAL = "arrowagg.final"
HEADER_REVISION = "arrowagg.revision"
HEADER_REVISION_KIND = "arrowagg.revision-kind"
HEADER_KEYS = "arrowagg.keys"  # on update revisions: the group-key columns, a JSON array
HEADER_WINDOW_ROWS = "arrowagg.window-rows"
# Scale-out only: which part of the window (one per repartition partition) a message is,
# and the end-of-window marker each part ends with.
HEADER_PART = "arrowagg.part"
HEADER_END_OF_WINDOW = "arrowagg.end-of-window"
HEADER_PART_ROWS = "arrowagg.part-rows"
HEADER_PART_MESSAGES = "arrowagg.part-messages"
# Session windows: every row carries its own session's bounds (``session``); with
# window.late: revise a row also lists, in REPLACES_COLUMN, the window_start of the
# emitted sessions of its keys it replaces.
HEADER_WINDOW_KIND = "arrowagg.window-kind"
# Session windows with the scale-out: each part's frontier marker ("every session of this
# part ending at or before T is out", its value T), and on each message of sessions that
# went out with it, the T of the marker that follows them.
HEADER_FRONTIER = "arrowagg.frontier"
HEADER_FRONTIER_BATCH = "arrowagg.frontier-batch"
REPLACES_COLUMN = "replaces"

OutputFormat = Literal["arrow", "json"]
# What a revision is to the ones before it: ``full``, the window's whole results;
# ``delta``, the rows since the previous revision, to be added per group (the memory
# budget emitted the window early); ``update``, the groups late rows changed
# (window.late: revise), each row replacing the row of the same keys in the window's
# closing revision (the one with arrowagg.final: true and kind full or delta).
RevisionKind = Literal["full", "delta", "update"]
REVISION_KINDS: tuple[RevisionKind, ...] = ("full", "delta", "update")


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
    part: tuple[int, int] | None = None  # (k, n): scale-out's part k of n, 1-based
    kind: RevisionKind = "full"
    keys: tuple[str, ...] | None = None  # the group-key columns (update revisions)
    sessions: bool = False  # session windows: each row has its own bounds
    # Given by wire.complete (complete=True) for session output only: the sessions this
    # revision replaced, as the subscriber held them.
    replaced: pl.DataFrame | None = None
    frontier_batch: int | None = None  # sessions, scale-out: the marker that follows


@dataclass(frozen=True)
class FrontierMarker:
    """A session part's frontier marker (scale-out): every session of part ``k`` of
    ``n`` ending at or before ``through_ms`` is out; ``messages`` messages (with ``rows``
    sessions from ``input_rows`` input rows) went out with it, each naming it in
    ``arrowagg.frontier-batch``."""

    through_ms: int
    part: tuple[int, int]
    rows: int
    messages: int
    input_rows: int


@dataclass(frozen=True)
class WindowEnd:
    """An end-of-window marker (scale-out): part ``k`` of ``n`` of the window is complete,
    with ``rows`` result rows in ``messages`` messages, from ``input_rows`` input rows."""

    start_ms: int
    end_ms: int
    part: tuple[int, int]
    rows: int
    messages: int
    input_rows: int


def encode_window(
    frame: pl.DataFrame, *, start_ms: int, end_ms: int, input_rows: int, fmt: OutputFormat,
    compression: Compression, max_bytes: int, revision: int = 0, final: bool = True,
    part: tuple[int, int] | None = None, kind: RevisionKind = "full",
    keys: Sequence[str] | None = None, sessions: bool = False,
    frontier_batch: int | None = None,
) -> list[OutputMessage]:
    """Encode one window's result ``frame`` (window_start, window_end, keys, aggregates,
    row_count) into one or more messages of at most ``max_bytes``; ``input_rows`` is the
    number of input rows it aggregates. ``keys``: the group-key columns, said in a header
    (update revisions need them to be applied). ``sessions``: the rows are sessions, each
    with its own bounds (said in a header); ``frontier_batch``: the frontier marker
    these sessions go out with (the scale-out)."""
    frame = _output_columns(frame)
    if fmt == "arrow":
        # One chunk: a streaming group_by leaves a result in many pieces.
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
        (HEADER_REVISION_KIND, kind.encode()),
        (HEADER_WINDOW_ROWS, str(input_rows).encode()),
    ]
    if keys is not None:
        base.append((HEADER_KEYS, json.dumps(list(keys)).encode()))  # ASCII: \u escapes
    if sessions:
        base.append((HEADER_WINDOW_KIND, b"session"))
    if part is not None:
        base.append((HEADER_PART, f"{part[0]}/{part[1]}".encode()))
    if frontier_batch is not None:
        base.append((HEADER_FRONTIER_BATCH, str(frontier_batch).encode()))
    key = str(start_ms).encode()
    return [
        OutputMessage(key, value, [*base, (HEADER_CHUNK, f"{i}/{len(values)}".encode())])
        for i, value in enumerate(values, start=1)
    ]


def _output_columns(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` in the output's one schema: string keys as plain strings (Arrow
    ``large_string``), never categorical. Whether a key arrives dictionary-encoded
    depends on the worker (the publisher's default), and whether the engine holds it as
    categorical on the mode (the scale-out's stage 2 merges strings); a subscriber must
    see neither (docs/wire-format.md)."""
    categorical = [name for name, dtype in frame.schema.items()
                   if isinstance(dtype, pl.Categorical | pl.Enum)]
    return frame.with_columns(pl.col(categorical).cast(pl.String)) if categorical else frame


def _ndjson_chunks(frame: pl.DataFrame, max_bytes: int) -> list[bytes]:
    text = rfc3339_columns(frame).write_ndjson().encode()
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


def encode_window_end(end: WindowEnd) -> OutputMessage:
    """The marker that closes part ``end.part`` of a window (no value)."""
    headers = [
        (HEADER_END_OF_WINDOW, b"true"),
        (HEADER_WINDOW_START, str(end.start_ms).encode()),
        (HEADER_WINDOW_END, str(end.end_ms).encode()),
        (HEADER_PART, f"{end.part[0]}/{end.part[1]}".encode()),
        (HEADER_PART_ROWS, str(end.rows).encode()),
        (HEADER_PART_MESSAGES, str(end.messages).encode()),
        (HEADER_WINDOW_ROWS, str(end.input_rows).encode()),
    ]
    return OutputMessage(str(end.start_ms).encode(), b"", headers)


def encode_frontier_marker(marker: FrontierMarker) -> OutputMessage:
    """A session part's frontier marker (no value)."""
    headers = [
        (HEADER_FRONTIER, str(marker.through_ms).encode()),
        (HEADER_WINDOW_KIND, b"session"),
        (HEADER_PART, f"{marker.part[0]}/{marker.part[1]}".encode()),
        (HEADER_PART_ROWS, str(marker.rows).encode()),
        (HEADER_PART_MESSAGES, str(marker.messages).encode()),
        (HEADER_WINDOW_ROWS, str(marker.input_rows).encode()),
    ]
    return OutputMessage(str(marker.through_ms).encode(), b"", headers)


def decode_message(value: bytes | None, headers: Headers,
                   ) -> OutputWindow | WindowEnd | FrontierMarker:
    """Decode any output message: a window's results (or a chunk), an end-of-window
    marker, or a session part's frontier marker."""
    found = _text_headers(headers)
    if HEADER_FRONTIER in found:
        return _frontier_marker(found)
    if found.get(HEADER_END_OF_WINDOW) != "true":
        return decode_output(value, headers)
    try:
        k, _, n = found[HEADER_PART].partition("/")
        return WindowEnd(int(found[HEADER_WINDOW_START]), int(found[HEADER_WINDOW_END]),
                         (int(k), int(n)), int(found[HEADER_PART_ROWS]),
                         int(found[HEADER_PART_MESSAGES]), int(found[HEADER_WINDOW_ROWS]))
    except (KeyError, ValueError) as err:
        raise OutputFormatError(f"malformed end-of-window marker (headers: {err})") from err


def _frontier_marker(found: Mapping[str, str]) -> FrontierMarker:
    try:
        k, _, n = found[HEADER_PART].partition("/")
        return FrontierMarker(int(found[HEADER_FRONTIER]), (int(k), int(n)),
                              int(found[HEADER_PART_ROWS]), int(found[HEADER_PART_MESSAGES]),
                              int(found[HEADER_WINDOW_ROWS]))
    except (KeyError, ValueError) as err:
        raise OutputFormatError(f"malformed frontier marker (headers: {err})") from err


def _text_headers(headers: Headers) -> dict[str, str]:
    pairs = headers.items() if isinstance(headers, Mapping) else headers or []
    return {name: raw.decode(errors="replace") if isinstance(raw, bytes) else raw or ""
            for name, raw in pairs}


def decode_output(value: bytes | None, headers: Headers) -> OutputWindow:
    """Decode one output message (Arrow or JSON lines) into an ``OutputWindow``."""
    found = _text_headers(headers)
    try:
        start = int(found[HEADER_WINDOW_START])
        end = int(found[HEADER_WINDOW_END])
        chunk_no, _, chunks = found.get(HEADER_CHUNK, "1/1").partition("/")
        meta = (found.get(HEADER_FINAL) == "true", int(found.get(HEADER_REVISION, "0")),
                int(found.get(HEADER_WINDOW_ROWS, "0")), (int(chunk_no), int(chunks)))
        k, _, n = found.get(HEADER_PART, "").partition("/")
        part = (int(k), int(n)) if n else None
    except KeyError as err:
        raise OutputFormatError(f"no {err.args[0]} header") from err
    except ValueError as err:
        raise OutputFormatError(f"a header that is not a number ({err})") from err
    kind, keys = _revision_kind(found, final=meta[0], revision=meta[1])
    try:
        if found.get(HEADER_CONTENT_TYPE) == CONTENT_TYPE_JSON:
            frame = pl.read_ndjson(io.BytesIO(value or b""))
        else:
            table = decode_ipc_stream(value)
            frame = pl.DataFrame(pa.Table.from_batches(table.to_batches(), table.schema))
    except (WireFormatError, pl.exceptions.PolarsError) as err:
        detail = " ".join(str(err).split())[:200]
        raise OutputFormatError(f"its value is not a window's results: {detail}") from err
    batch = found.get(HEADER_FRONTIER_BATCH)
    return OutputWindow(start, end, *meta, frame=frame, part=part, kind=kind, keys=keys,
                        sessions=found.get(HEADER_WINDOW_KIND) == "session",
                        frontier_batch=None if batch is None else _number(batch))


def _number(text: str) -> int:
    try:
        return int(text)
    except ValueError as err:
        raise OutputFormatError(f"a header that is not a number ({err})") from err


def _revision_kind(found: Mapping[str, str], *, final: bool, revision: int,
                   ) -> tuple[RevisionKind, tuple[str, ...] | None]:
    """The kind header (before it existed: full for a first final, else a delta) and the
    key columns the message names (an update must)."""
    text = found.get(HEADER_REVISION_KIND)
    if text is None:
        return ("full" if final and revision == 0 else "delta"), None
    kind = next((k for k in REVISION_KINDS if k == text), None)
    if kind is None:
        raise OutputFormatError(f"unknown {HEADER_REVISION_KIND} {text!r}")
    if kind != "update" and HEADER_KEYS not in found:
        return kind, None
    try:
        keys = json.loads(found[HEADER_KEYS])
    except (KeyError, ValueError) as err:
        raise OutputFormatError(f"an update revision without a valid {HEADER_KEYS} "
                                "header") from err
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise OutputFormatError(f"{HEADER_KEYS} must be a JSON array of column names")
    return kind, tuple(keys)
