"""The run loop on the in-memory broker, wired for a test: ``Rig`` holds a broker, a
consumer, a sink and the processor, with a clock the test moves; ``reference`` is what
the daemon must emit, computed by plain Polars over every published row."""

from __future__ import annotations

from typing import Any, Final, Literal

import polars as pl
import pyarrow as pa
from polars.testing import assert_frame_equal

from consumer.compose import build_pipeline
from consumer.config import settings_from_dict
from consumer.kafka.processor import StreamProcessor
from consumer.kafka.sink import AtLeastOnceSink, OutputSink, TransactionalSink
from consumer.service.observer import ProcessorObserver
from tests.consumer.kafka.fake_broker import FakeBroker, FakeConsumer, FakeProducer, FakeSink
from wire.input import encode_ipc_stream
from wire.output import decode_output

SOURCE, SINK = "in", "out"
P0, P1 = (SOURCE, 0), (SOURCE, 1)
SIZE_MS = 1_000
SITES = ("a", "b", "c")


class Clock:
    """Processing time: moved by the test, and by a millisecond at every reading, so a
    loop left to run on its own sees its commit interval pass."""

    def __init__(self) -> None:
        self.now_ms = 0

    def __call__(self) -> int:
        self.now_ms += 1
        return self.now_ms


SinkKind = Literal["fake", "transactional", "at_least_once"]
ABSENT: Final = object()  # config(): leaves a key out; None writes null


def config(**sections: dict[str, object]) -> dict[str, object]:
    data: dict[str, object] = {
        "kafka": {"bootstrap_servers": "fake:9092", "group_id": "g"},
        "input": {"topics": [SOURCE]},
        "output": {"topic": SINK},
        "window": {"kind": "tumbling", "time": "event", "timestamp_column": "ts",
                   "size_ms": SIZE_MS, "idle_timeout_ms": 60_000},
        "processing": {"commit_interval_ms": 1_000, "poll_max_messages": 100},
    }
    for name, values in sections.items():
        base = data.get(name, {})
        assert isinstance(base, dict)
        data[name] = {k: v for k, v in {**base, **values}.items() if v is not ABSENT}
    return data


def batch(ts_ms: int, value: float = 1.0) -> pa.Table:
    """One row per site at ``ts_ms``."""
    return pa.table({
        "site": list(SITES),
        "ts": pa.array([ts_ms] * len(SITES), pa.timestamp("ms", tz="UTC")),
        "v": [value] * len(SITES),
    })


class Rig:
    """A broker, a consumer, a sink and the processor wired to them."""

    def __init__(self, partitions: int = 2, *, sink: SinkKind = "fake",
                 observer: ProcessorObserver | None = None, broker: FakeBroker | None = None,
                 **sections: dict[str, object]) -> None:
        """``sink``: a FakeSink, or one of the daemon's own sinks over FakeProducers
        (``self.producers``, one per producer the sink makes), which fail where the
        test asks the consumer's calls to (``self.consumer.fail``). ``broker``: another
        rig's, for an instance taking over from it (``published`` is then to be shared)."""
        if broker is None:
            broker = FakeBroker()
            broker.create_topic(SOURCE, partitions)
            broker.create_topic(SINK)
        self.broker = broker
        self.consumer = FakeConsumer(self.broker)
        self.fake_sink = FakeSink(self.broker)
        self.producers: list[FakeProducer] = []
        self.sink: OutputSink = self.fake_sink
        if sink == "transactional":
            self.sink = TransactionalSink({}, new_producer=self._new_producer)
        elif sink == "at_least_once":
            self.sink = AtLeastOnceSink({}, new_producer=self._new_producer)
        self.clock = Clock()
        self.consumer.clock = self.clock
        self.settings = settings_from_dict(config(**sections))
        self.pipeline = build_pipeline(self.settings)
        self.processor = StreamProcessor(
            self.consumer, self.sink, self.pipeline, topics=[SOURCE],
            processing=self.settings.processing, observer=observer, clock=self.clock)
        self.published: list[pa.Table] = []
        self.processor.subscribe()

    def _new_producer(self, _config: dict[str, Any]) -> FakeProducer:
        self.producers.append(FakeProducer(self.broker, self.consumer.failures))
        return self.producers[-1]

    def publish(self, partition: int, table: pa.Table) -> int:
        self.published.append(table)
        return self.broker.produce(SOURCE, partition, encode_ipc_stream(table))

    def turns(self, count: int = 3, *, step_ms: int = 100) -> None:
        for _ in range(count):
            self.processor.run_once()
            self.clock.now_ms += step_ms

    def committed(self, partition: tuple[str, int]) -> int | None:
        return self.broker.committed_offset(*partition)

    def output(self) -> pl.DataFrame:
        frames = [decode_output(r.value, r.headers).frame for r in self.broker.output(SINK)]
        return pl.concat(frames).with_columns(pl.col("window_start").dt.epoch("ms"))


def reference(tables: list[pa.Table]) -> pl.DataFrame:
    """Plain Polars over every published row: the windows the daemon must emit."""
    rows = pl.concat([pl.DataFrame(t) for t in tables])
    start = pl.col("ts").dt.epoch("ms") // SIZE_MS * SIZE_MS
    return (rows.group_by(start.alias("window_start"), "site")
            .agg(pl.col("v").sum(), pl.len().cast(pl.Int64).alias("row_count"))
            .sort("window_start", "site"))


def sorted_output(rig: Rig) -> pl.DataFrame:
    return rig.output().select("window_start", "site", "v", "row_count").sort(
        "window_start", "site")


def publish_windows(rig: Rig, windows: range) -> None:
    """A batch in each window, on each of the two partitions."""
    for window in windows:
        for partition in (0, 1):
            rig.publish(partition, batch(window * SIZE_MS + 100 + partition))


def closed_output_is_exact(rig: Rig, *, before_ms: int) -> None:
    """Publish a closing batch past ``before_ms``, run, and check every window before it
    against the reference."""
    for partition in (0, 1):
        rig.publish(partition, batch(before_ms + 500))
    rig.turns(12)
    expected = reference(rig.published).filter(pl.col("window_start") < before_ms)
    assert_frame_equal(sorted_output(rig), expected, check_dtypes=False)
