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


def test_late_rows_within_the_bound_revise_their_window_on_the_output_topic() -> None:
    pipe = pipeline(late="revise", revision_lateness_ms=5_000)
    pipe.assign(P0, None, None, NOW_MS)
    pipe.process(messages(rows(NOW_MS - 2_000, NOW_MS - 1_999, NOW_MS - 500)), NOW_MS)
    first = pipe.flush(NOW_MS)
    pipe.committed(first, NOW_MS)
    (window,) = [decode_output(r.value, r.headers) for r in first.records]
    assert (window.revision, window.kind, window.frame["revision"].to_list()) == (
        0, "full", [0, 0])
    pipe.process(messages(rows(NOW_MS - 1_998), first_offset=1), NOW_MS)
    second = pipe.flush(NOW_MS)
    (update,) = [decode_output(r.value, r.headers) for r in second.records]
    assert (update.start_ms, update.revision, update.kind, update.keys) == (
        window.start_ms, 1, "update", ("site",))
    assert update.frame.select("site", "v", "row_count", "revision").rows() == [
        ("s0", 2.0, 2, 1)]
    assert [r.topic for r in second.records] == ["out"]
    assert second.offsets[P0].metadata.retention is not None


def test_late_rows_are_counted_and_dropped_with_late_drop() -> None:
    pipe = build_pipeline(settings_from_dict({
        "input": {"topics": ["in"]}, "output": {"topic": "out"},
        "window": {"kind": "tumbling", "timestamp_column": "ts", "size_ms": 1_000,
                   "late": "drop"},
    }))
    pipe.assign(P0, None, None, NOW_MS)
    pipe.process(messages(rows(NOW_MS - 2_000, NOW_MS - 500)), NOW_MS)
    pipe.committed(pipe.flush(NOW_MS), NOW_MS)
    done = pipe.process(messages(rows(NOW_MS - 1_900), first_offset=1), NOW_MS)
    assert (done.late_rows, pipe.counters.late_rows) == (1, 1)
    assert pipe.flush(NOW_MS).records == []


def test_no_commit_while_a_revision_waits_for_a_replay() -> None:
    p1: PartitionKey = ("in", 1)
    before = pipeline(late="revise", revision_lateness_ms=5_000)
    for partition in (P0, p1):
        before.assign(partition, None, None, NOW_MS)
    old = [InputMessage(P0, 0, rows(NOW_MS - 2_000, NOW_MS - 500)),
           InputMessage(p1, 0, rows(NOW_MS - 1_900, NOW_MS - 400))]
    before.process(old, NOW_MS)
    flush = before.flush(NOW_MS)
    before.committed(flush, NOW_MS)

    after = pipeline(late="revise", revision_lateness_ms=5_000)  # a restart
    for partition, point in flush.offsets.items():
        after.assign(partition, point.offset, point.metadata, NOW_MS)
    after.process([old[0], InputMessage(P0, 1, rows(NOW_MS - 1_800))], NOW_MS)
    held = after.flush(NOW_MS)
    assert (held.commit, held.records, held.offsets) == (False, [], {})
    after.process([old[1]], NOW_MS)  # p1's replay: its row of the window is back
    done = after.flush(NOW_MS)
    assert done.commit
    (update,) = [decode_output(r.value, r.headers) for r in done.records]
    assert update.frame.select("site", "row_count").sort("site").rows() == [("s0", 3)]


def test_partial_states_are_merged_before_the_budget_emits_windows_early() -> None:
    """Six polls of the same two groups leave six pending partials (twelve rows, past a
    budget of ten groups): held once each, the groups are within it and nothing goes out
    early."""
    pipe = build_pipeline(settings_from_dict({
        "kafka": {"bootstrap_servers": "unused:9092", "group_id": "g"},
        "input": {"topics": ["in"], "max_groups": 10, "over_budget": "emit_early"},
        "output": {"topic": "out"},
        "window": {"kind": "tumbling", "time": "event", "timestamp_column": "ts",
                   "size_ms": 1_000, "idle_timeout_ms": 60_000},
        "processing": {"merge_every_batches": 8},
    }))
    pipe.assign(P0, None, None, NOW_MS)
    start = NOW_MS - NOW_MS % 1_000
    for offset in range(6):
        pipe.process(messages(rows(start + offset, start + offset), first_offset=offset),
                     NOW_MS)
        flush = pipe.flush(NOW_MS)
        assert flush.windows == [], f"poll {offset}: emitted early"
        if flush.commit:
            pipe.committed(flush, NOW_MS)
    closing = pipe.flush(NOW_MS + 60_001)  # idle: the window closes, final
    windows = [decode_output(r.value, r.headers) for r in closing.records if r.topic == "out"]
    assert [(w.final, w.frame["row_count"].to_list()) for w in windows] == [(True, [6, 6])]
