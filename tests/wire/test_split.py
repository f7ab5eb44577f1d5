"""wire/split.py: which encodings run with the encoder's own threads, and that it does
not change a byte."""

from __future__ import annotations

import pyarrow as pa
import pytest

from wire.input import Compression, encode_ipc_stream
from wire.split import split_encoded


class RecordingEncoder:
    """encode_ipc_stream with zstd, noting each call's row count and ``threads``."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, bool]] = []

    def __call__(self, table: pa.Table, *, threads: bool = True) -> bytes:
        self.calls.append((table.num_rows, threads))
        return encode_ipc_stream(table, "zstd", threads=threads)


def _table(rows: int) -> pa.Table:
    return pa.table({"key": [f"k{i % 97}" for i in range(rows)],
                     "value": [i * 0.5 for i in range(rows)]})


def test_pieces_on_the_pool_are_encoded_without_the_writers_threads() -> None:
    encoder = RecordingEncoder()
    table = _table(200_000)
    pieces = split_encoded(table, 100_000, encoder)
    assert len(pieces) > 1
    schema_only, probe, *piece_calls = encoder.calls
    assert schema_only == (0, True)  # the framing's size, on the caller's thread
    assert probe[1]  # the prefix that sizes the pieces, likewise
    assert len(piece_calls) == len(pieces)  # none came out too big here
    assert not any(threads for _rows, threads in piece_calls)
    rows = sum(pa.ipc.open_stream(p).read_all().num_rows for p in pieces)
    assert rows == table.num_rows


def test_a_table_encoded_whole_keeps_the_writers_threads() -> None:
    encoder = RecordingEncoder()
    (whole,) = split_encoded(_table(1_000), 1_000_000, encoder)
    assert encoder.calls[-1] == (1_000, True)
    assert pa.ipc.open_stream(whole).read_all().equals(_table(1_000))


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
def test_the_writers_threads_do_not_change_a_byte(compression: Compression) -> None:
    table = _table(50_000)
    assert (encode_ipc_stream(table, compression, threads=False)
            == encode_ipc_stream(table, compression))
