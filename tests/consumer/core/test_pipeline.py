"""The per-poll pipeline on its own: messages in, records and commit points out."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from consumer.compose import build_pipeline
from consumer.config import settings_from_dict
from consumer.core.offsets import CommitMetadata
from consumer.core.pipeline import Pipeline
from consumer.core.types import InputMessage, PartitionKey
from wire.input import decode_ipc_stream, encode_ipc_stream
from wire.output import decode_output

P0: PartitionKey = ("in", 0)
NOW_MS = 1_800_000_000_000  # the wall clock of these tests (2027-01-15)
HOUR_MS = 3_600_000
YEAR_2200_MS = 7_258_118_400_000


def pipeline(**window: object) -> Pipeline:
    return build_pipeline(settings_from_dict({
        "kafka": {"bootstrap_servers": "unused:9092", "group_id": "g"},
        "input": {"topics": ["in"]},
        "output": {"topic": "out", "dlq_topic": "dlq", "late_topic": "late"},
        "window": {"kind": "tumbling", "time": "event", "timestamp_column": "ts",
                   "size_ms": 1_000, "idle_timeout_ms": 60_000, **window},
    }))


def rows(*times_ms: int) -> bytes:
    return encode_ipc_stream(pa.table({
        "site": [f"s{i % 2}" for i in range(len(times_ms))],
        "ts": pa.array(times_ms, pa.timestamp("ms", "UTC")),
        "v": [1.0] * len(times_ms),
    }))


def messages(*values: bytes, first_offset: int = 0) -> list[InputMessage]:
    return [InputMessage(P0, first_offset + i, v) for i, v in enumerate(values)]


def test_rows_from_the_future_are_dead_lettered_and_do_not_move_the_watermark() -> None:
    pipe = pipeline()
    pipe.assign(P0, None, None, NOW_MS)
    done = pipe.process(messages(rows(NOW_MS - 1_500, YEAR_2200_MS, NOW_MS - 1_200)), NOW_MS)
    assert done.rejected_rows == {"future-event-time": 1}
    assert pipe.counters.rejected_rows == 1
    later = pipe.process(messages(rows(NOW_MS - 500), first_offset=1), NOW_MS)
    assert later.late_rows == 0, "the watermark stayed where the real rows put it"
    flush = pipe.flush(NOW_MS + 60_001)  # every partition idle: everything closes
    dead = [r for r in flush.records if r.topic == "dlq"]
    assert len(dead) == 1
    assert dead[0].value is not None
    assert decode_ipc_stream(dead[0].value).column("ts").cast(pa.int64()).to_pylist() == [
        YEAR_2200_MS]
    assert dict(dead[0].headers)["arrowagg.dlq.error-class"] == b"future-event-time"
    windows = [decode_output(r.value, r.headers) for r in flush.records if r.topic == "out"]
    assert sum(w.frame["row_count"].sum() for w in windows) == 3
    assert flush.offsets[P0].offset == 2


def test_the_bound_follows_the_wall_clock_and_can_be_lifted() -> None:
    pipe = pipeline(max_future_ms=None)
    pipe.assign(P0, None, None, NOW_MS)
    assert pipe.process(messages(rows(YEAR_2200_MS)), NOW_MS).rejected_rows == {}
    bounded = pipeline(max_future_ms=HOUR_MS)
    bounded.assign(P0, None, None, NOW_MS)
    in_an_hour = bounded.process(messages(rows(NOW_MS + HOUR_MS)), NOW_MS)
    assert in_an_hour.rejected_rows == {}


def test_a_poisoned_commit_does_not_bring_the_future_back() -> None:
    pipe = pipeline()
    poisoned = CommitMetadata(frontier=YEAR_2200_MS, position=5, max_event_ms=YEAR_2200_MS)
    pipe.assign(P0, 5, poisoned, NOW_MS)
    done = pipe.process(messages(rows(NOW_MS - 2_000), rows(NOW_MS - 100), first_offset=5),
                        NOW_MS)
    assert done.late_rows == 0
    closed = pipe.flush(NOW_MS).windows
    assert [w.start_ms for w in closed] == [NOW_MS - 2_000]  # closed by the real watermark


def test_a_message_without_rows_first_leaves_the_plan_to_the_data() -> None:
    pipe = pipeline()
    pipe.assign(P0, None, None, NOW_MS)
    warm_up = encode_ipc_stream(pa.table({"hello": pa.array([], pa.int64())}))
    done = pipe.process(messages(warm_up, rows(NOW_MS - 2_000, NOW_MS - 100)), NOW_MS)
    assert done.rejected == []
    flush = pipe.flush(NOW_MS + 60_001)
    windows = [decode_output(r.value, r.headers).frame for r in flush.records]
    assert pl.concat(windows)["row_count"].sum() == 2
    assert flush.offsets[P0].offset == 2
