"""The input wire format: one Kafka message value is one Arrow IPC stream.

This is the only module that knows the format; the workers' publisher and the daemon's
decoder both import it, so the two sides cannot drift apart. ``docs/wire-format.md`` is
the prose version of this module.

Decoding treats every value as untrusted: batches are fully validated, declared sizes are
checked against ``DecodeLimits`` *before* anything is decompressed, and every failure is
a ``WireFormatError`` with a short, stable ``reason`` code.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Final, Literal

import pyarrow as pa
from pyarrow import ipc

from wire.errors import InputRejectedError
from wire.ipc_sizes import declared_batches
from wire.split import RowTooBigError, split_encoded
from wire.validate import validate_batch

CONTENT_TYPE: Final = "application/vnd.apache.arrow.stream"
HEADER_CONTENT_TYPE: Final = "content-type"
HEADER_SCHEMA_FINGERPRINT: Final = "arrowagg.schema-fingerprint"
HEADER_PRODUCER_ID: Final = "arrowagg.producer-id"
HEADER_SEQUENCE: Final = "arrowagg.sequence"
HEADER_CHUNK: Final = "arrowagg.chunk"

Compression = Literal["none", "lz4", "zstd"]

_CONTINUATION: Final = b"\xff\xff\xff\xff"
_FILE_MAGIC: Final = b"ARROW1\x00\x00"
_MAX_SEQUENCE: Final = (1 << 63) - 1  # so that a sequence fits a signed 64-bit column
_SEQUENCE_RE: Final = re.compile(rb"[0-9]{1,19}")
_CHUNK_RE: Final = re.compile(rb"([0-9]{1,9})/([0-9]{1,9})")


class WireFormatError(InputRejectedError):
    """A message that is not valid arrowagg input.

    ``reason`` is a short stable code for the dead-letter queue and metrics:
    ``empty-stream``, ``not-arrow-ipc``, ``invalid-ipc``, ``invalid-schema``,
    ``trailing-bytes``, ``too-many-rows``, ``too-many-bytes`` or ``bad-header``.
    ``str(err)`` is a one-line explanation for a human.
    """


def schema_fingerprint(schema: pa.Schema) -> str:
    """A stable 32-hex-digit digest of the field names, types and nullability.

    Schema and field metadata are ignored, so pandas or Polars annotations do not split
    one logical schema into several fingerprints.
    """
    canonical = [[field.name, str(field.type), field.nullable] for field in schema]
    text = json.dumps(canonical, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def encode_ipc_stream(data: pa.Table | pa.RecordBatch, compression: Compression = "none",
                      *, threads: bool = True) -> bytes:
    """Encode ``data`` as one complete Arrow IPC stream (schema, batches, end-of-stream);
    ``threads``: whether the writer may compress columns on Arrow's own threads."""
    options = ipc.IpcWriteOptions(compression=None if compression == "none" else compression,
                                  use_threads=threads)
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, data.schema, options=options) as writer:
        writer.write(data)
    return bytes(sink.getvalue().to_pybytes())


def encode_for_size(
    table: pa.Table, *, max_bytes: int, compression: Compression = "none"
) -> list[bytes]:
    """Encode ``table`` as complete IPC streams of at most ``max_bytes`` each.

    The streams hold the table's rows in order and split only between rows; nothing is
    ever dropped. An empty table gives ``[]``. Raises ``WireFormatError("too-many-bytes")``
    only when a single row on its own does not fit.
    """
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be positive, got {max_bytes}")
    if table.num_rows == 0:
        return []
    try:
        return split_encoded(table, max_bytes, partial(encode_ipc_stream, compression=compression))
    except RowTooBigError as err:
        raise WireFormatError(
            "too-many-bytes",
            f"row {err.row} alone encodes to {err.encoded_bytes} bytes, more than the "
            f"{max_bytes} allowed per message; raise the message size limit",
        ) from err  # the cause keeps the numbers for a caller that can name its option


_PLAIN_STRINGS: Final = (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)


def dictionary_keys(table: pa.Table) -> pa.Table:
    """``table`` with its top-level string columns dictionary-encoded, for the wire.

    Group keys repeat: a dictionary sends each distinct value once per message, and the
    daemon groups on its integer codes (Polars categoricals) instead of hashing strings.
    Any reader of Arrow decodes it to the same values; the daemon accepts both forms.
    """
    for index, field in enumerate(table.schema):
        if any(is_kind(field.type) for is_kind in _PLAIN_STRINGS):
            column = table.column(index).dictionary_encode()
            table = table.set_column(index, field.with_type(column.type), column)
    return table


def message_headers(
    *, fingerprint: str, producer_id: str, sequence: int, chunk: tuple[int, int] | None = None
) -> list[tuple[str, bytes]]:
    """The Kafka headers of one input message; ``chunk`` is ``(i, n)``, 1-based: ``1 <= i <= n``."""
    if not 0 <= sequence <= _MAX_SEQUENCE:
        raise ValueError(f"sequence must be in [0, 2**63), got {sequence}")
    headers = [
        (HEADER_CONTENT_TYPE, CONTENT_TYPE.encode()),
        (HEADER_SCHEMA_FINGERPRINT, fingerprint.encode()),
        (HEADER_PRODUCER_ID, producer_id.encode()),
        (HEADER_SEQUENCE, str(sequence).encode()),
    ]
    if chunk is not None:
        index, count = chunk
        if not 1 <= index <= count:
            raise ValueError(f"chunk must be (i, n) with 1 <= i <= n, got {chunk}")
        headers.append((HEADER_CHUNK, f"{index}/{count}".encode()))
    return headers


@dataclass(frozen=True)
class WireHeaders:
    """What an input message's headers say; ``None`` wherever a header is absent."""

    content_type: str | None
    schema_fingerprint: str | None
    producer_id: str | None
    sequence: int | None
    chunk: tuple[int, int] | None


HeaderValue = bytes | str | None
# Both shapes confluent_kafka's Message.headers() may return, or None.
Headers = Sequence[tuple[str, HeaderValue]] | Mapping[str, HeaderValue] | None


def parse_headers(headers: Headers) -> WireHeaders:
    """Read the arrowagg headers of an input message, as ``Message.headers()`` gives them.

    Lenient about absence (plain pyarrow workers send no headers at all) and about key
    case; the last occurrence of a repeated key wins. Raises
    ``WireFormatError("bad-header")`` when a header is present but malformed, or when the
    content type is set to anything but an Arrow IPC stream.
    """
    found: dict[str, bytes] = {}
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    for key, value in pairs:
        if value is not None:
            found[key.lower()] = value.encode() if isinstance(value, str) else value
    content_type = _text_header(found, HEADER_CONTENT_TYPE)
    if content_type is not None:
        media_type = content_type.split(";", 1)[0].strip().lower()
        if media_type != CONTENT_TYPE:
            raise WireFormatError(
                "bad-header", f"content-type is {content_type!r}, expected {CONTENT_TYPE!r}"
            )
    return WireHeaders(
        content_type=content_type,
        schema_fingerprint=_text_header(found, HEADER_SCHEMA_FINGERPRINT),
        producer_id=_text_header(found, HEADER_PRODUCER_ID),
        sequence=_sequence_header(found.get(HEADER_SEQUENCE)),
        chunk=_chunk_header(found.get(HEADER_CHUNK)),
    )


def _text_header(found: dict[str, bytes], key: str) -> str | None:
    raw = found.get(key)
    if raw is None:
        return None
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise WireFormatError("bad-header", f"{key} is not valid UTF-8: {raw[:40]!r}") from None


def _sequence_header(raw: bytes | None) -> int | None:
    if raw is None:
        return None
    if not _SEQUENCE_RE.fullmatch(raw) or int(raw) > _MAX_SEQUENCE:
        raise WireFormatError(
            "bad-header", f"{HEADER_SEQUENCE} must be a decimal in [0, 2**63), got {raw[:40]!r}"
        )
    return int(raw)


def _chunk_header(raw: bytes | None) -> tuple[int, int] | None:
    if raw is None:
        return None
    match = _CHUNK_RE.fullmatch(raw)
    if match is None or not 1 <= int(match[1]) <= int(match[2]):
        raise WireFormatError(
            "bad-header", f"{HEADER_CHUNK} must be 'i/n' with 1 <= i <= n, got {raw[:40]!r}"
        )
    return int(match[1]), int(match[2])


@dataclass(frozen=True)
class DecodeLimits:
    """Per-message ceilings on what one decoded value may hold."""

    max_rows: int = 10_000_000
    max_decoded_bytes: int = 1 << 30


DEFAULT_DECODE_LIMITS: Final = DecodeLimits()


def decode_ipc_stream(
    value: bytes | None, limits: DecodeLimits = DEFAULT_DECODE_LIMITS
) -> pa.Table:
    """Decode one untrusted message value into a Table; anything wrong is a WireFormatError.

    Accepts any Arrow IPC stream, compressed or not, with or without its end-of-stream
    marker, and also an Arrow IPC file (Feather v2), whose embedded stream is read. A
    stream with a schema and no rows gives an empty table of that schema.
    """
    if not value:
        raise WireFormatError(
            "empty-stream", "the message has no value; expected an Arrow IPC stream"
        )
    is_file = value.startswith(_FILE_MAGIC)
    stream = memoryview(value)[len(_FILE_MAGIC) :] if is_file else memoryview(value)
    looks_like_ipc = is_file or value.startswith(_CONTINUATION)
    try:
        _check_declared_sizes(stream, limits)
        return _read_validated(stream, limits, allow_trailing=is_file)
    except (pa.ArrowException, OSError, ValueError) as exc:
        reason = "invalid-ipc" if looks_like_ipc else "not-arrow-ipc"
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise WireFormatError(reason, detail[:300]) from exc


def _read_validated(stream: memoryview, limits: DecodeLimits, *, allow_trailing: bool) -> pa.Table:
    source = pa.BufferReader(pa.py_buffer(stream))
    reader = ipc.open_stream(source)
    _check_schema(reader.schema)
    batches: list[pa.RecordBatch] = []
    rows = decoded_bytes = 0
    for batch in reader:
        # A plain read checks little; full validation catches bad offsets and invalid
        # UTF-8 before Polars or a compute kernel trips over them.
        validate_batch(batch)
        rows += batch.num_rows
        decoded_bytes += batch.get_total_buffer_size()
        _enforce(limits, rows, decoded_bytes)
        batches.append(batch)
    trailing = len(stream) - source.tell()
    if trailing and not allow_trailing:
        raise WireFormatError(
            "trailing-bytes",
            f"{trailing} bytes follow the end-of-stream marker; send one stream per message",
        )
    return pa.Table.from_batches(batches, schema=reader.schema)


def _check_schema(schema: pa.Schema) -> None:
    _decode_schema_text(schema)
    # Arrow allows repeated column names, but arrowagg addresses columns by name and
    # neither pyarrow's field lookup nor Polars can tell the copies apart.
    repeated = sorted(name for name, count in Counter(schema.names).items() if count > 1)
    if repeated:
        raise WireFormatError(
            "invalid-schema", f"column names must be unique; repeated: {repeated[:5]}"
        )


def _decode_schema_text(schema: pa.Schema) -> list[str]:
    """Every field name and time zone in ``schema``, nested ones included.

    pyarrow decodes these from UTF-8 only when they are first read, so a bad one would
    surface far from here as a UnicodeDecodeError; reading them all now makes it a
    rejection (``invalid-ipc``) instead.
    """
    texts: list[str] = []
    pending = list(schema)
    while pending:
        field = pending.pop()
        kind = field.type.value_type if pa.types.is_dictionary(field.type) else field.type
        texts.append(field.name)
        if pa.types.is_timestamp(kind) and kind.tz is not None:
            texts.append(kind.tz)
        pending.extend(kind.field(index) for index in range(kind.num_fields))
    return texts


def _check_declared_sizes(stream: memoryview, limits: DecodeLimits) -> None:
    # A compressed body can expand a thousandfold, and pyarrow allocates whatever a
    # buffer's length prefix declares: summing declared sizes first stops a
    # decompression bomb before it costs memory.
    rows = decoded_bytes = 0
    for batch in declared_batches(stream):
        rows += batch.rows
        decoded_bytes += batch.body_bytes
        _enforce(limits, rows, decoded_bytes)


def _enforce(limits: DecodeLimits, rows: int, decoded_bytes: int) -> None:
    if rows > limits.max_rows:
        raise WireFormatError(
            "too-many-rows",
            f"more than {limits.max_rows} rows in one message; send smaller batches",
        )
    if decoded_bytes > limits.max_decoded_bytes:
        raise WireFormatError(
            "too-many-bytes",
            f"more than {limits.max_decoded_bytes} decoded bytes in one message; "
            "send smaller batches",
        )
