"""Late rows become records of one (input message, window) each, cut to fit the output
size limit, with headers that say where they came from and which window they missed."""

from __future__ import annotations

import polars as pl
import pyarrow as pa
from polars.testing import assert_frame_equal

from consumer.core.late import late_records
from consumer.core.types import MESSAGE_INDEX, MessageRef
from wire.input import decode_ipc_stream

REFS = [MessageRef(("in", 2), 40, 3), MessageRef(("in", 0), 7, 2000)]


def late_frame() -> pl.DataFrame:
    """What an engine returns: message 0 late for one window, message 1 for two."""
    rows = 1 + 600 + 1400
    return pl.DataFrame({
        "k": [f"key-{i:05d}" for i in range(rows)],
        "v": [float(i) for i in range(rows)],
        MESSAGE_INDEX: [0] + [1] * 2000,
        "window_start": [0] + [1_000] * 600 + [2_000] * 1400,
        "window_end": [1_000] + [2_000] * 600 + [3_000] * 1400,
    })


def headers(record_headers: object) -> dict[str, bytes]:
    assert isinstance(record_headers, list)
    return dict(record_headers)


def test_one_stream_per_message_and_window_each_within_the_limit() -> None:
    records = late_records(late_frame(), REFS, topic="late", compression="none",
                           max_bytes=8_000)
    assert all(r.topic == "late" for r in records)
    assert all(r.value is not None and len(r.value) <= 8_000 for r in records)
    by_window: dict[bytes, list[pa.Table]] = {}
    for record in records:
        found = headers(record.headers)
        assert record.value is not None
        by_window.setdefault(found["arrowagg.window-start"], []).append(
            decode_ipc_stream(record.value))
    assert sorted(by_window) == [b"0", b"1000", b"2000"]
    assert len(by_window[b"2000"]) > 1, "1,400 rows do not fit 8 kB: split by rows"
    got = pl.concat([pl.DataFrame(pa.concat_tables(by_window[w])) for w in sorted(by_window)])
    assert_frame_equal(got, late_frame().drop(MESSAGE_INDEX))


def test_headers_name_the_origin_the_window_and_the_piece() -> None:
    records = late_records(late_frame(), REFS, topic="late", compression="none",
                           max_bytes=1_000_000)
    first, *others = [headers(r.headers) for r in records]
    assert first == {
        "content-type": b"application/vnd.apache.arrow.stream",
        "arrowagg.late.original-topic": b"in",
        "arrowagg.late.original-partition": b"2",
        "arrowagg.late.original-offset": b"40",
        "arrowagg.window-start": b"0",
        "arrowagg.window-end": b"1000",
        "arrowagg.chunk": b"1/1",
    }
    assert {(h["arrowagg.late.original-offset"], h["arrowagg.window-start"]) for h in others} \
        == {(b"7", b"1000"), (b"7", b"2000")}
    assert records[0].key == b"0"
