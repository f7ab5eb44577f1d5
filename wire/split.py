"""Splitting a table by rows into encoded pieces that each fit a message size limit.

``wire.input.encode_for_size`` is the public entry; this module knows nothing of the
wire format beyond the ``encode`` function it is handed. Pieces are encoded on a small
thread pool: the IPC writer and its compressors release the GIL, and a big window's
result (a million groups) is tens of megabytes to compress. The pool's pieces are
encoded with the writer's own threads off (``threads=False``): both would compete for
the same cores, and five 1M-row windows encoded in 0.854 s with them, 0.754 s without.
A table encoded whole keeps them, as there they are the only parallelism.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from wire.errors import ArrowaggError


class Encode(Protocol):
    def __call__(self, table: pa.Table, *, threads: bool = True) -> bytes:
        """``table`` encoded; ``threads``: whether the encoder may use threads of its own."""
        ...


# A table whose in-memory size is this many times the limit is split without first being
# encoded whole (Arrow IPC compression rarely shrinks tabular data tenfold).
PROBE_FROM: Final = 10
_VIEW_TO_PLAIN: Final = {pa.string_view(): pa.large_string(), pa.binary_view(): pa.large_binary()}
_pool: ThreadPoolExecutor | None = None


def _encoders() -> ThreadPoolExecutor:
    """The shared encoding threads, started on first use (and again in a forked child,
    which inherits the pool object but not its threads)."""
    global _pool  # noqa: PLW0603 - one pool per process
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1),
                                   thread_name_prefix="arrowagg-encode")
    return _pool


def _forget_pool() -> None:
    global _pool  # noqa: PLW0603
    _pool = None


os.register_at_fork(after_in_child=_forget_pool)


class RowTooBigError(ArrowaggError):
    """One row alone encodes larger than the limit."""

    def __init__(self, row: int, encoded_bytes: int) -> None:
        super().__init__(f"row {row} alone encodes to {encoded_bytes} bytes")
        self.row = row
        self.encoded_bytes = encoded_bytes


def split_encoded(table: pa.Table, max_bytes: int, encode: Encode) -> list[bytes]:
    """``table`` (at least one row) as encoded pieces of at most ``max_bytes``, in order."""
    limit = _Limit(max_bytes, len(encode(table.slice(0, 0))), encode)
    if table.nbytes > PROBE_FROM * max_bytes:
        # Far too big for one message: estimate the split from a prefix instead of
        # encoding (and compressing) the whole table once only to learn it does not fit.
        probe_rows = max(1, table.num_rows * 2 * max_bytes // table.nbytes)
        probe = encode(compact(table.slice(0, probe_rows)))
        per_row = max(len(probe) - limit.overhead, 1) / probe_rows
        rows = max(1, int(0.9 * max(max_bytes - limit.overhead, 0) / per_row))
    else:
        whole = encode(table)
        if len(whole) <= max_bytes:
            return [whole]
        rows = limit.rows_that_fit(table.num_rows, len(whole))
    starts = range(0, table.num_rows, rows)
    encoded = _encoders().map(
        lambda start: encode(compact(table.slice(start, rows)), threads=False), starts)
    streams: list[bytes] = []
    for start, value in zip(starts, encoded, strict=True):
        if len(value) <= max_bytes:
            streams.append(value)
        else:
            streams += limit.resplit(table.slice(start, rows), start, len(value))
    return streams


@dataclass(frozen=True)
class _Limit:
    max_bytes: int
    overhead: int  # the encoded size of no rows: schema and framing
    encode: Encode

    def rows_that_fit(self, rows: int, encoded_bytes: int) -> int:
        return rows_that_fit(rows, encoded_bytes, self.max_bytes, self.overhead)

    def resplit(self, piece: pa.Table, first_row: int, encoded_bytes: int) -> Iterator[bytes]:
        """A piece that came out too big, split again one estimate at a time."""
        offset = 0
        rows = self.rows_that_fit(piece.num_rows, encoded_bytes)
        while offset < piece.num_rows:
            part = compact(piece.slice(offset, rows))
            value = self.encode(part)
            if len(value) <= self.max_bytes:
                yield value
                offset += part.num_rows
            elif part.num_rows == 1:
                raise RowTooBigError(first_row + offset, len(value))
            else:
                rows = self.rows_that_fit(part.num_rows, len(value))


def rows_that_fit(rows: int, encoded_bytes: int, max_bytes: int, overhead: int) -> int:
    """Estimate how many of ``rows`` fit, strictly fewer than ``rows`` so splitting ends."""
    per_row = max(encoded_bytes - overhead, 1) / rows
    # 10% slack because rows are not all the same size and compression is not linear.
    estimate = int(0.9 * max(max_bytes - overhead, 0) / per_row)
    return max(1, min(rows // 2 if estimate >= rows else estimate, rows - 1))


def compact(table: pa.Table) -> pa.Table:
    """A slice's top-level view and dictionary columns, holding only the slice's values.

    The IPC writer trims the buffers of a sliced string or list column, but writes a
    sliced view column's data buffers and a dictionary column's whole dictionary as they
    are: without this every piece would weigh as much as the entire column (for a
    window of a million keys, the dictionary alone can exceed the limit).
    """
    for index, field in enumerate(table.schema):
        plain = _VIEW_TO_PLAIN.get(field.type)
        if plain is not None:
            column = table.column(index).cast(plain).cast(field.type)
            table = table.set_column(index, field, column)
        elif pa.types.is_dictionary(field.type):
            chunks = [_used_dictionary(c) for c in table.column(index).chunks]
            table = table.set_column(index, field, pa.chunked_array(chunks, field.type))
    return table


def _used_dictionary(array: pa.DictionaryArray) -> pa.DictionaryArray:
    used = pc.unique(array.indices).drop_null()
    if len(used) == len(array.dictionary):
        return array
    indices = pc.index_in(array.indices, value_set=used).cast(array.type.index_type)
    return pa.DictionaryArray.from_arrays(indices, array.dictionary.take(used),
                                          ordered=array.type.ordered)
