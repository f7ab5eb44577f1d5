"""What each batch of an Arrow IPC stream declares about its size, without decoding it.

Reads the flatbuffer metadata of every message (field slots as in Arrow's Message.fbs
and Schema.fbs) and, for compressed bodies, the 8-byte uncompressed-length prefix of
each buffer. Nothing is decompressed or allocated, so this is safe to run on untrusted
input before pyarrow decodes it. Malformed metadata raises ``ValueError``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

import pyarrow as pa
from pyarrow import ipc

_HEADER_DICTIONARY_BATCH: Final = 2
_HEADER_RECORD_BATCH: Final = 3
_UNCOMPRESSED_PREFIX: Final = -1  # a compressed body's buffer stored as is
_U8: Final = struct.Struct("<B")
_U16: Final = struct.Struct("<H")
_I32: Final = struct.Struct("<i")
_U32: Final = struct.Struct("<I")
_I64: Final = struct.Struct("<q")


@dataclass(frozen=True)
class DeclaredBatch:
    """A record batch's row count (0 for dictionary batches) and decoded body size."""

    rows: int
    body_bytes: int


def declared_batches(stream: memoryview) -> Iterator[DeclaredBatch]:
    """One entry per record batch or dictionary batch message, in stream order."""
    for message in ipc.MessageReader.open_stream(pa.BufferReader(pa.py_buffer(stream))):
        meta = memoryview(message.metadata)
        root = _deref(meta, 0)
        header_type = _read(_U8, meta, _field(meta, root, 1))
        if header_type not in (_HEADER_DICTIONARY_BATCH, _HEADER_RECORD_BATCH):
            continue  # the schema; tensors are refused later by the stream reader
        batch = _deref(meta, _field(meta, root, 2))
        is_dictionary = header_type == _HEADER_DICTIONARY_BATCH
        if is_dictionary:
            batch = _deref(meta, _field(meta, batch, 1))
        length = _optional_field(meta, batch, 0)
        rows = 0 if length is None or is_dictionary else _read(_I64, meta, length)
        body = memoryview(b"" if message.body is None else message.body)
        yield DeclaredBatch(rows, _body_bytes(meta, batch, body))


def _body_bytes(meta: memoryview, batch: int, body: memoryview) -> int:
    buffers = _buffers(meta, batch)
    if _optional_field(meta, batch, 3) is None:  # uncompressed: lengths are the sizes
        return sum(buffers[1::2])
    total = 0
    for offset, length in zip(buffers[::2], buffers[1::2], strict=True):
        if length == 0:
            continue
        declared = _read(_I64, body, offset)
        if declared < _UNCOMPRESSED_PREFIX or length < 8:
            raise ValueError(f"malformed compressed buffer at body offset {offset}")
        total += length - 8 if declared == _UNCOMPRESSED_PREFIX else declared
    return total


def _buffers(meta: memoryview, batch: int) -> tuple[int, ...]:
    """The batch's buffer vector, flattened: offset, length, offset, length, ..."""
    position = _optional_field(meta, batch, 2)
    if position is None:
        return ()
    vector = _deref(meta, position)
    count = _read(_U32, meta, vector)
    if vector + 4 + 16 * count > len(meta):
        raise ValueError(f"an IPC offset points outside its {len(meta)}-byte buffer")
    # One unpack for the whole vector (16 bytes a buffer) rather than two per buffer.
    return _vector_layout(count).unpack_from(meta, vector + 4)


@lru_cache(maxsize=64)
def _vector_layout(count: int) -> struct.Struct:
    return struct.Struct(f"<{2 * count}q")


def _deref(meta: memoryview, position: int) -> int:
    return position + _read(_U32, meta, position)


def _field(meta: memoryview, table: int, slot: int) -> int:
    position = _optional_field(meta, table, slot)
    if position is None:
        raise ValueError(f"IPC metadata table lacks required field {slot}")
    return position


def _optional_field(meta: memoryview, table: int, slot: int) -> int | None:
    """The position of field ``slot`` of the flatbuffer table at ``table``, if present."""
    vtable = table - _read(_I32, meta, table)
    if 4 + 2 * slot + 2 > _read(_U16, meta, vtable):
        return None
    relative = _read(_U16, meta, vtable + 4 + 2 * slot)
    return table + relative if relative else None


def _read(layout: struct.Struct, data: memoryview, position: int) -> int:
    """One little-endian integer at ``position``; out of range is an error, not a wrap."""
    if position < 0 or position + layout.size > len(data):
        raise ValueError(f"an IPC offset points outside its {len(data)}-byte buffer")
    (value,) = layout.unpack_from(data, position)
    return int(value)
