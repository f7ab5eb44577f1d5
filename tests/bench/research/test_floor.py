"""bench.research.floor: what it switches off is off only while it runs, and every run
it times agrees with arrowagg's result."""

from __future__ import annotations

import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal
from pyarrow import ipc

from bench import kernel, payloads
from bench.research import floor
from bench.sizes import KernelCase
from wire.input import WireFormatError, decode_ipc_stream


def _invalid_utf8() -> bytes:
    """An IPC stream whose one string is the byte 0xff: well formed, invalid UTF-8."""
    strings = pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(
        pa.array([0, 1], pa.int32()).buffers()[1]), pa.py_buffer(b"\xff")])
    batch = pa.record_batch([strings], names=["site"])
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    value: bytes = sink.getvalue().to_pybytes()
    return value


def test_input_unchecked_skips_validation_only_while_open() -> None:
    value = _invalid_utf8()
    with pytest.raises(WireFormatError, match="Invalid UTF8"):
        decode_ipc_stream(value)
    with floor.input_unchecked():
        assert decode_ipc_stream(value).num_rows == 1
    with pytest.raises(WireFormatError):
        decode_ipc_stream(value)


@pytest.mark.parametrize("encoding", payloads.ENCODINGS)
def test_the_runs_without_checks_give_duckdbs_result(encoding: payloads.Encoding) -> None:
    built = payloads.build(KernelCase("toy", 6, 400, 30, 3), encoding)
    reference = kernel.normalised(kernel.run_duckdb(built, 2))
    for run in (floor.run_arrowagg_unchecked, floor.run_polars_from_bytes):
        got = kernel.normalised(run(built, 2)).select(reference.columns)
        assert_frame_equal(got, reference, check_exact=False, rel_tol=1e-9)


def test_every_run_agrees_and_is_timed() -> None:
    built = payloads.build(KernelCase("toy", 4, 500, 50, 2), "dictionary")
    figures = floor.measure(built, repetitions=1, poll_messages=2)
    assert set(figures["median_s"]) == {
        "arrowagg", "arrowagg_unchecked", "datafusion", "polars_from_bytes",
        "polars_with_output", "polars_per_poll", "polars_read_ahead", "polars_naive",
        "polars_group_by", "int_key_in_query", "int_key_group_by", "output"}
    assert all(s > 0 for s in figures["median_s"].values())
