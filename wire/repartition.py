"""The repartition topic of the two-stage scale-out: what stage 1 writes and stage 2 reads.

Three kinds of records, told apart by the ``arrowagg.kind`` header:

- ``partial``: one window's partial aggregation state for the group keys that hash to
  the record's partition, as an Arrow IPC stream (``window_start``, the keys, the state
  columns, ``__rows``). ``arrowagg.plan`` carries the aggregation plan (keys, functions,
  expressions: JSON) so that any instance can merge and finalize it.
- ``values``: for plans with aggregates that do not decompose (median, quantile,
  n_unique, expressions), the window's buffered rows for the same keys (``window_start``,
  the keys, the columns those aggregates read), with the same headers as a partial.
- ``progress``: JSON, written to every partition in the same transaction as the
  partials before it: for each input partition the writer owns, the window frontier it
  has emitted through and whether it is idle, and the windows it emitted partials for.

Stage 2 reads one repartition partition in order, so a progress record that moves an
input partition past a window always comes after that partition's partials for it.
docs/wire-format.md describes the format; only arrowagg instances read it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import pyarrow as pa

from wire.errors import ArrowaggError
from wire.input import (
    CONTENT_TYPE,
    HEADER_CHUNK,
    HEADER_CONTENT_TYPE,
    Compression,
    Headers,
    decode_ipc_stream,
    encode_for_size,
)
from wire.output import HEADER_WINDOW_END, HEADER_WINDOW_START

HEADER_KIND: Final = "arrowagg.kind"
HEADER_PLAN: Final = "arrowagg.plan"
KIND_PARTIAL: Final = "partial"
KIND_PROGRESS: Final = "progress"
KIND_VALUES: Final = "values"
_STATE_KINDS: Final = (KIND_PARTIAL, KIND_VALUES)
CONTENT_TYPE_PROGRESS: Final = "application/json"  # one JSON document, not JSON lines


class RepartitionFormatError(ArrowaggError):
    """A repartition-topic record that arrowagg did not write (or a newer one did)."""


@dataclass(frozen=True)
class ReportedFrontier:
    """An input partition's progress as its stage-1 owner reports it."""

    topic: str
    partition: int
    frontier_ms: int | None  # its rows of every window ending at or before are emitted
    idle: bool


@dataclass(frozen=True)
class ProgressRecord:
    writer: str
    partitions: tuple[ReportedFrontier, ...]
    windows: tuple[tuple[int, int], ...]  # (start, end) of windows with partials just sent


@dataclass(frozen=True)
class Partial:
    """A ``partial`` record's state, or a ``values`` record's rows (``kind``)."""

    start_ms: int
    end_ms: int
    plan: str
    state: pa.Table
    kind: str = KIND_PARTIAL


def encode_partial(state: pa.Table, *, start_ms: int, end_ms: int, plan: str,
                   compression: Compression, max_bytes: int, kind: str = KIND_PARTIAL,
                   ) -> list[tuple[bytes, list[tuple[str, bytes]]]]:
    """``state`` (or, ``kind`` values, buffered rows) as Arrow IPC streams of at most
    ``max_bytes``, with their headers."""
    pieces = encode_for_size(state, max_bytes=max_bytes, compression=compression)
    base = [(HEADER_CONTENT_TYPE, CONTENT_TYPE.encode()), (HEADER_KIND, kind.encode()),
            (HEADER_WINDOW_START, str(start_ms).encode()),
            (HEADER_WINDOW_END, str(end_ms).encode()), (HEADER_PLAN, plan.encode())]
    return [(piece, [*base, (HEADER_CHUNK, f"{i}/{len(pieces)}".encode())])
            for i, piece in enumerate(pieces, start=1)]


def encode_progress(progress: ProgressRecord) -> tuple[bytes, list[tuple[str, bytes]]]:
    value = json.dumps({
        "v": 1, "writer": progress.writer,
        "partitions": [[p.topic, p.partition, p.frontier_ms, p.idle]
                       for p in progress.partitions],
        "windows": [list(w) for w in progress.windows],
    }, separators=(",", ":")).encode()
    return value, [(HEADER_CONTENT_TYPE, CONTENT_TYPE_PROGRESS.encode()),
                   (HEADER_KIND, KIND_PROGRESS.encode())]


def record_kind(headers: Headers) -> str:
    """``partial``, ``values`` or ``progress``; RepartitionFormatError for anything else."""
    kind = _headers(headers).get(HEADER_KIND)
    if kind not in (*_STATE_KINDS, KIND_PROGRESS):
        raise RepartitionFormatError(f"not a repartition record (arrowagg.kind={kind!r})")
    return kind


def decode_partial(value: bytes | None, headers: Headers) -> Partial:
    found = _headers(headers)
    try:
        start, end = int(found[HEADER_WINDOW_START]), int(found[HEADER_WINDOW_END])
        plan = found[HEADER_PLAN]
    except (KeyError, ValueError) as err:
        raise RepartitionFormatError(f"partial record without its headers ({err})") from err
    kind = found.get(HEADER_KIND, KIND_PARTIAL)
    if kind not in _STATE_KINDS:
        raise RepartitionFormatError(f"not a state record (arrowagg.kind={kind!r})")
    return Partial(start, end, plan, decode_ipc_stream(value), kind)


def decode_progress(value: bytes | None) -> ProgressRecord:
    try:
        data = json.loads(value or b"")
        if data.get("v") != 1:
            raise RepartitionFormatError(f"progress record of version {data.get('v')!r}")
        partitions = tuple(
            ReportedFrontier(str(t), int(p), None if f is None else int(f), bool(i))
            for t, p, f, i in data["partitions"])
        windows = tuple((int(s), int(e)) for s, e in data["windows"])
        return ProgressRecord(str(data["writer"]), partitions, windows)
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise RepartitionFormatError(f"malformed progress record ({err})") from err


def _headers(headers: Headers) -> dict[str, str]:
    pairs: Sequence[tuple[str, bytes | str | None]] | Mapping[str, bytes | str | None]
    pairs = headers or []
    items = pairs.items() if isinstance(pairs, Mapping) else pairs
    return {name: raw.decode(errors="replace") if isinstance(raw, bytes) else raw or ""
            for name, raw in items}
