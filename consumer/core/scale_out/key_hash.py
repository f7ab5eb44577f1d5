"""Which repartition partition a group's partial state goes to: a stable hash of its keys.

Every instance must send a given (window, keys) to the same partition, whatever its
Python, Polars or platform, or one group would be merged in two places. So the hash is
spelled out here, FNV-1a (64 bit) over a canonical text of the keys, rather than taken
from a library whose hash may change between versions (Polars documents that its own
does). It is vectorised with numpy, one step per byte position, over the state's rows:
the states of a window are O(groups), not O(rows), so this is cheap where it runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl
import pyarrow as pa

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_SEPARATOR = "\x1f"  # between keys (unit separator)
_NULL = "\x00"  # a null key, distinct from any text


def key_text(frame: pl.DataFrame, keys: Sequence[str]) -> pl.Series:
    """Each row's keys as one canonical string: text as is (plain or categorical alike),
    numbers in decimal, timestamps as epoch microseconds whatever their unit or zone,
    other temporals as their integer value, nulls as NUL, joined by the unit separator.
    Equal keys give equal text whichever types an instance's first message fixed."""
    if not keys:
        return pl.Series("key", [""] * frame.height, dtype=pl.String)
    parts = []
    for name in keys:
        dtype = frame.schema[name]
        column = pl.col(name)
        if isinstance(dtype, pl.Datetime):
            column = column.dt.epoch("us")
        elif dtype.is_temporal():
            column = column.to_physical()
        parts.append(column.cast(pl.String).fill_null(_NULL))
    return frame.select(pl.concat_str(parts, separator=_SEPARATOR).alias("key")).to_series()


def fnv1a(texts: pl.Series) -> np.ndarray:
    """FNV-1a 64 of each string's UTF-8 bytes."""
    array = texts.to_arrow()
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    array = array.cast(pa.large_string())
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int64)[
        array.offset: array.offset + len(array) + 1]
    data = np.frombuffer(array.buffers()[2] or b"", dtype=np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    hashes = np.full(len(array), _FNV_OFFSET, dtype=np.uint64)
    for position in range(int(lengths.max()) if len(lengths) else 0):
        live = lengths > position
        byte = data[starts[live] + position].astype(np.uint64)
        hashes[live] = (hashes[live] ^ byte) * _FNV_PRIME
    return hashes


def partition_of(frame: pl.DataFrame, keys: Sequence[str], partitions: int) -> pl.Series:
    """The repartition partition (0 .. partitions-1) of each row's group keys."""
    hashes = fnv1a(key_text(frame, keys))
    return pl.Series("partition", (hashes % np.uint64(partitions)).astype(np.int64))
