from __future__ import annotations

import struct

import pyarrow as pa
import pytest

from wire.input import Compression, encode_ipc_stream
from wire.ipc_sizes import DeclaredBatch, declared_batches

TABLE = pa.table({
    "n": pa.array(range(1_000), pa.int64()),
    "s": pa.array([f"value {i}" for i in range(1_000)]),
})


def declared(value: bytes) -> list[DeclaredBatch]:
    return list(declared_batches(memoryview(value)))


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
def test_declared_sizes_match_the_decoded_buffers(compression: Compression) -> None:
    value = encode_ipc_stream(TABLE, compression)
    (batch,) = declared(value)
    assert batch.rows == 1_000
    decoded = pa.ipc.open_stream(value).read_next_batch()
    # Declared lengths are unpadded; decoded buffers may carry up to 7 bytes of padding.
    assert 0 <= decoded.get_total_buffer_size() - batch.body_bytes < 8 * 4


def test_compressed_bodies_declare_their_uncompressed_size() -> None:
    zeros = pa.table({"z": pa.array([0] * 100_000, pa.int64())})
    value = encode_ipc_stream(zeros, "zstd")
    assert len(value) < 10_000
    assert [b.body_bytes for b in declared(value)] == [800_000]


def test_dictionary_batches_count_bytes_but_no_rows() -> None:
    table = pa.table({"d": pa.array(["a", "b", "a"]).dictionary_encode()})
    batches = declared(encode_ipc_stream(table))
    assert [b.rows for b in batches] == [0, 3]
    assert all(b.body_bytes > 0 for b in batches)


def test_a_compressed_dictionary_is_counted_too() -> None:
    words = pa.array([f"{i:0>200}" for i in range(2_000)]).dictionary_encode()
    value = encode_ipc_stream(pa.table({"d": words}), "zstd")
    dictionary, records = declared(value)
    assert dictionary.rows == 0
    assert dictionary.body_bytes > 400_000 > len(value)
    assert records.rows == 2_000


def test_a_schema_only_stream_declares_no_batches() -> None:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, TABLE.schema):
        pass
    assert declared(sink.getvalue().to_pybytes()) == []


def test_a_buffer_vector_longer_than_its_metadata_is_refused() -> None:
    value = bytearray(encode_ipc_stream(TABLE))
    # The record batch's buffer vector: 5 buffers (n: validity, data; s: validity,
    # offsets, data), its count followed by the first buffer's offset, 0.
    at = bytes(value).index(struct.pack("<I", 5) + bytes(8))
    value[at:at + 4] = struct.pack("<I", 1 << 30)
    with pytest.raises((ValueError, OSError)):  # ours, or pyarrow's flatbuffer verifier
        declared(bytes(value))


def test_many_batches_of_many_columns_are_all_counted() -> None:
    wide = pa.table({f"c{i}": pa.array(range(100), pa.int32()) for i in range(40)})
    (batch,) = declared(encode_ipc_stream(wide))
    assert batch.rows == 100
    assert batch.body_bytes == 40 * 100 * 4  # no validity buffers: no nulls
