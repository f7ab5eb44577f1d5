"""The DLQ guard stops the daemon when bad input becomes the norm, not before."""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pytest

from consumer.core.dlq import DlqLimit, DlqLimitExceededError, dead_letter, dead_rows
from consumer.core.types import InputMessage, OutputRecord
from wire.errors import InputRejectedError
from wire.input import decode_ipc_stream


def feed(guard: DlqLimit, pattern: str) -> None:
    for mark in pattern:
        guard.record(valid=mark == ".")


def test_consecutive_invalid_over_the_limit_stops() -> None:
    guard = DlqLimit(max_consecutive_invalid=3, max_invalid_ratio=1.0, window_messages=10)
    feed(guard, "xxx.xxx.")  # three in a row, twice: still within the limit
    with pytest.raises(DlqLimitExceededError, match="4 invalid messages in a row"):
        feed(guard, "xxxx")


def test_ratio_is_judged_over_a_full_window_only() -> None:
    guard = DlqLimit(max_consecutive_invalid=100, max_invalid_ratio=0.5, window_messages=10)
    feed(guard, "xxxxx")  # 100% invalid, but only 5 messages seen: not yet judged
    feed(guard, ".....")  # 50% of a full window: at the limit, not over it
    feed(guard, "xxxxx")  # the window slides: each new bad one replaces an old one
    with pytest.raises(DlqLimitExceededError, match="60% of the last 10 messages"):
        feed(guard, "x")  # now a good one leaves the window: 6 of the last 10 are bad


def test_good_input_keeps_the_window_clean() -> None:
    guard = DlqLimit(max_consecutive_invalid=2, max_invalid_ratio=0.2, window_messages=10)
    feed(guard, ("x" + "." * 9) * 50)  # a steady 10% of bad input is tolerated
    with pytest.raises(DlqLimitExceededError, match="3 invalid messages in a row"):
        feed(guard, "xxx")


def message(value: bytes, key: bytes | None = b"worker-3") -> InputMessage:
    return InputMessage(("in", 1), 99, value, key, None, 1_700_000_000_000)


def fields(record: OutputRecord) -> dict[str, bytes]:
    return {name: value for name, value in record.headers if isinstance(value, bytes)}


def record_bytes(record: OutputRecord) -> int:
    return (len(record.value or b"") + len(record.key or b"")
            + sum(len(n) + len(v or b"") for n, v in record.headers))


def test_a_dead_letter_too_big_for_the_dlq_topic_is_cut_and_says_so() -> None:
    value = bytes(range(256)) * 12_000  # 3 MB: the input topic allowed it, the DLQ won't
    err = InputRejectedError("not-arrow-ipc", "not an Arrow IPC stream")
    record = dead_letter(message(value), err, topic="dlq", group_id="g", max_bytes=1_000_000)
    found = fields(record)
    assert record_bytes(record) <= 1_000_000 - 512
    assert record.value == value[:len(record.value or b"")]
    assert found["arrowagg.dlq.truncated"] == b"true"
    assert found["arrowagg.dlq.original-size"] == b"3072000"
    assert found["arrowagg.dlq.original-sha256"] == hashlib.sha256(value).hexdigest().encode()
    assert found["arrowagg.dlq.original-offset"] == b"99"
    assert record.key == b"worker-3"


def test_a_dead_letter_that_fits_is_the_original_untouched() -> None:
    err = InputRejectedError("not-arrow-ipc", "not an Arrow IPC stream")
    record = dead_letter(message(b"garbage"), err, topic="dlq", group_id="g",
                         max_bytes=1_000_000)
    assert record.value == b"garbage"
    assert "arrowagg.dlq.truncated" not in fields(record)
    assert fields(record)["arrowagg.dlq.error-message"] == b"not an Arrow IPC stream"


def test_rejected_rows_are_dead_lettered_as_arrow_pieces_that_fit() -> None:
    rows = pa.table({"k": [f"key-{i}" for i in range(5_000)], "v": list(range(5_000))})
    err = InputRejectedError("future-event-time", "5000 of 5000 rows are from the future")
    records = dead_rows(message(b"unused"), rows, err, topic="dlq", group_id="g",
                        max_bytes=10_000)
    assert len(records) > 1
    assert all(record_bytes(r) <= 10_000 for r in records)
    got = pa.concat_tables([decode_ipc_stream(r.value) for r in records])
    assert got.equals(rows)
    found = fields(records[0])
    assert found["arrowagg.dlq.error-class"] == b"future-event-time"
    assert found["arrowagg.dlq.rows"] == b"5000"
    assert found["arrowagg.chunk"] == f"1/{len(records)}".encode()
