"""Running one configuration in each of the daemon's modes, in-process: one instance's
pipeline, committed as the run loop commits it, and both stages of the scale-out on the
in-memory broker. Shared by the tests that compare the modes' output."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from consumer.compose import build_two_stages
from consumer.config import settings_from_dict
from consumer.core.pipeline import Pipeline
from consumer.core.types import HeaderPairs, OutputRecord, PartitionKey
from consumer.kafka.processor import StreamProcessor
from tests.consumer.kafka.fake_broker import FakeBroker, FakeConsumer, FakeSink
from tests.consumer.kafka.rig import Clock

NOW_MS = 1_800_000_000_000
T0 = NOW_MS - 60_000
SOURCE: PartitionKey = ("in", 0)


def config(window: dict[str, Any], **sections: dict[str, Any]) -> dict[str, Any]:
    return {"kafka": {"bootstrap_servers": "unused:9092", "group_id": "g"},
            "input": {"topics": ["in"]}, "output": {"topic": "out"},
            "window": {"time": "event", "timestamp_column": "ts", "idle_timeout_ms": 60_000,
                       **window}, **sections}


TUMBLING = {"kind": "tumbling", "size_ms": 1_000}


def committed(pipe: Pipeline, now_ms: int, *, force: bool = False) -> list[OutputRecord]:
    """The records of one flush, committed (as the run loop would) when it asks to be."""
    flush = pipe.flush(now_ms, force=force)
    if not flush.commit:
        return []
    pipe.committed(flush, now_ms)
    return flush.records


def scale_out_records(batch: Callable[[int], bytes]) -> list[OutputRecord]:
    """The output of two instances running both stages on the in-memory broker, fed
    ``batch(start_ms)`` for three windows on each of two input partitions."""
    broker = FakeBroker()
    for topic, partitions in (("in", 2), ("rep", 2), ("out", 1)):
        broker.create_topic(topic, partitions)
    clock = Clock()
    clock.now_ms = NOW_MS
    processors = []
    for name, owned in (("a", [("in", 0), ("rep", 0)]), ("b", [("in", 1), ("rep", 1)])):
        settings = settings_from_dict(config(
            {**TUMBLING, "idle_timeout_ms": 2_000},
            processing={"instance_id": name, "commit_interval_ms": 300},
            scale_out={"repartition_topic": "rep", "partitions": 2}))
        consumer = FakeConsumer(broker)
        processor = StreamProcessor(consumer, FakeSink(broker),
                                    build_two_stages(settings, {("in", 0), ("in", 1)}),
                                    topics=["in", "rep"], processing=settings.processing,
                                    clock=clock)
        processor.subscribe()
        consumer.rebalance("assign", owned)
        processors.append(processor)
    for offset in range(3):
        for partition in (0, 1):
            broker.produce("in", partition, batch(T0 + offset * 1_000))
    for _ in range(60):
        for processor in processors:
            processor.run_once()
        clock.now_ms += 100
    return [OutputRecord("out", m.key(), m.value(), header_pairs(m.headers()))
            for m in broker.topics["out"][0]]


def header_pairs(raw: HeaderPairs | dict[str, str | bytes | None] | None) -> HeaderPairs:
    return list(raw.items()) if isinstance(raw, dict) else list(raw or [])
