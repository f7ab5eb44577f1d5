"""wire/validate.py accepts exactly what pyarrow's full validation accepts.

The reference is pyarrow's own ``validate(full=True)``: arrays are built straight from
(often corrupt) buffers, past the checks a normal constructor makes, and each must be
rejected by ``validate_batch`` if and only if pyarrow's full validation rejects it.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from wire.validate import _proven_valid, validate_batch

_BYTES = st.lists(st.sampled_from([b"a", b"Z", b"0", b"\xc3\xa9", b"\xe2\x82\xac", b"\xff",
                                   b"\x80", b"\xc3"]), max_size=12).map(b"".join)


def _strings(kind: pa.DataType, offsets: list[int], data: bytes,
             validity: list[bool] | None) -> pa.Array:
    width = pa.int32() if kind == pa.string() else pa.int64()
    offset_buffer = pa.array(offsets, width).buffers()[1]
    bitmap = None if validity is None else pa.array(validity, pa.bool_()).buffers()[1]
    nulls = 0 if validity is None else validity.count(False)
    return pa.Array.from_buffers(kind, len(offsets) - 1, [bitmap, offset_buffer,
                                                          pa.py_buffer(data)],
                                 null_count=nulls)


def _same_verdict(array: pa.Array) -> None:
    batch = pa.record_batch([array], names=["s"])
    try:
        batch.validate(full=True)
        expected = None
    except pa.ArrowInvalid as err:
        expected = err
    if expected is None:
        validate_batch(batch)
    else:
        with pytest.raises((pa.ArrowInvalid, ValueError)):
            validate_batch(batch)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from([pa.string(), pa.large_string()]),
       offsets=st.lists(st.integers(-2, 14), min_size=1, max_size=6), data=_BYTES,
       nulls=st.none() | st.lists(st.booleans(), min_size=5, max_size=5))
def test_strings_are_rejected_exactly_when_pyarrow_rejects_them(
    kind: pa.DataType, offsets: list[int], data: bytes, nulls: list[bool] | None
) -> None:
    validity = None if nulls is None else nulls[: len(offsets) - 1]
    try:
        array = _strings(kind, offsets, data, validity)
    except pa.ArrowInvalid:
        assume(False)  # the constructor's own checks refused it: nothing reaches us
    _same_verdict(array)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(indices=st.lists(st.integers(-3, 6), max_size=6),
       values=st.lists(st.sampled_from(["a", "bc", "é", ""]), max_size=4),
       with_nulls=st.booleans())
def test_dictionaries_are_rejected_exactly_when_pyarrow_rejects_them(
    indices: list[int], values: list[str], with_nulls: bool
) -> None:
    index_array = pa.array(indices, pa.int32())
    if with_nulls and indices:
        index_array = pa.array([None, *indices[1:]], pa.int32())
    # safe=False: the indices are taken as they are, out of range or not.
    array = pa.DictionaryArray.from_arrays(index_array, pa.array(values, pa.string()),
                                           safe=False)
    _same_verdict(array)


def test_the_columns_workers_send_take_the_fast_path() -> None:
    ascii_keys = pa.array(["site-01", "sensor-07", ""], pa.string())
    assert _proven_valid(ascii_keys)
    assert _proven_valid(pa.array(["a", "b"], pa.large_string()))
    assert _proven_valid(ascii_keys.dictionary_encode())


def test_what_the_fast_path_cannot_prove_goes_to_pyarrow() -> None:
    assert not _proven_valid(pa.array(["café"]))  # valid, but not ASCII
    assert not _proven_valid(pa.array(["a", None]))  # nulls are pyarrow's to count
    assert not _proven_valid(pa.array([1.5, 2.5]))
    validate_batch(pa.record_batch({"s": pa.array(["café", None]), "x": [1.5, 2.5]}))
