"""What ``check`` says, read as an operator reads it: the warnings, with the topics as
the broker has them (or has them not yet)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from consumer.checkup import describe_windows, warnings
from consumer.config import Settings, settings_from_dict
from consumer.kafka.topics import TopicState


def settings(aggregation: dict[str, Any] | None = None, **window: Any) -> Settings:
    return settings_from_dict({
        "aggregation": aggregation or {},
        "kafka": {"bootstrap_servers": "unused:9092"},
        "input": {"topics": ["sensors"]},
        "output": {"topic": "sensors-agg", "late_topic": "sensors-late",
                   "dlq_topic": "sensors-dlq"},
        "processing": {"instance_id": "a"},
        "window": {"kind": "tumbling", "time": "event", "timestamp_column": "ts",
                   "size_ms": 5_000, "idle_timeout_ms": 5_000, **window},
    }, environ={})


def others(found: list[str]) -> list[str]:
    """The warnings besides the plan's, which have a test of their own."""
    return [w for w in found if not w.startswith("aggregation.schema_from is not set")]


def topic(name: str, partitions: int) -> TopicState:
    return TopicState(name, partitions, 1, 1_048_588)


LATENESS = ("window.allowed_lateness_ms is 0: a window closes as soon as every input "
            "partition has read a row past its end, and its rows that come after are late; "
            "producers sharing a partition rarely deliver in event-time order: allow for their "
            "disorder")


def test_no_lateness_is_warned_of_in_words_that_hold_before_the_topics_exist() -> None:
    """Not "with 0 partitions": topics not created yet are no partitions to speak of."""
    assert others(warnings(settings(), {})) == [LATENESS]
    assert others(warnings(settings(), None)) == [LATENESS]
    assert others(warnings(settings(), {"sensors": topic("sensors", 3)})) == [LATENESS]


def test_one_input_partition_needs_no_lateness_and_some_lateness_needs_no_warning() -> None:
    assert others(warnings(settings(), {"sensors": topic("sensors", 1)})) == []
    assert others(warnings(settings(allowed_lateness_ms=1_000), {})) == []


def test_windows_align_on_their_size_when_they_tumble_and_on_their_step_when_they_hop() -> None:
    assert "a window starts at a multiple of its size)" in describe_windows(settings())
    hopping = settings(kind="hopping", step_ms=1_000)
    assert "a window starts at a multiple of its step)" in describe_windows(hopping)


def test_a_plan_left_to_the_first_message_is_warned_of_and_a_pinned_one_is_not(
    tmp_path: Path,
) -> None:
    sample = tmp_path / "sample.arrows"
    table = pa.table({"site": ["a"], "ts": pa.array([0], pa.timestamp("ms", "UTC")),
                      "v": [1.0]})
    with pa.ipc.new_stream(str(sample), table.schema) as writer:
        writer.write_table(table)
    assert warnings(settings(), {})[0] == (
        "aggregation.schema_from is not set: the plan will be derived from whichever message "
        "with rows arrives first; its string and timestamp columns become the keys, and a "
        "message without one of them is dead-lettered (schema-mismatch). Pin it: "
        "aggregation.schema_from: FILE (an Arrow or Parquet file with the input's schema), "
        "or list aggregation.keys")
    assert warnings(settings({"keys": ["site"]}), {})[0] == (
        "aggregation.schema_from is not set: aggregation.keys fixes the keys, but the "
        "aggregates and their types will come from whichever message with rows arrives "
        "first; pin them with aggregation.schema_from: FILE")
    assert warnings(settings({"schema_from": str(sample)}), {}) == [LATENESS]
