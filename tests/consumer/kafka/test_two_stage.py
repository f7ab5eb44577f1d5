"""Both stages of the scale-out, two instances on the in-memory broker: input keyed by
worker (every partition holds every group), output one row per (window, keys), and each
window closed by one end-of-window marker per repartition partition."""

from __future__ import annotations

import random

import polars as pl
import pyarrow as pa
from polars.testing import assert_frame_equal

from consumer.compose import build_two_stages
from consumer.config import settings_from_dict
from consumer.kafka.processor import StreamProcessor
from tests.consumer.kafka.fake_broker import FakeBroker, FakeConsumer, FakeSink
from tests.consumer.kafka.rig import Clock
from wire.input import encode_ipc_stream
from wire.output import OutputWindow, WindowEnd, decode_message

SOURCE, REPARTITION, SINK = "in", "rep", "out"
INPUTS, PARTS = 4, 3
SIZE_MS = 1_000
SITES = [f"site-{i}" for i in range(7)]


def settings(instance: str) -> dict[str, object]:
    return {
        "kafka": {"bootstrap_servers": "fake:9092", "group_id": "g"},
        "input": {"topics": [SOURCE]},
        "output": {"topic": SINK},
        "window": {"kind": "tumbling", "time": "event", "timestamp_column": "ts",
                   "size_ms": SIZE_MS, "idle_timeout_ms": 2_000},
        "processing": {"instance_id": instance, "commit_interval_ms": 300},
        "scale_out": {"repartition_topic": REPARTITION, "partitions": PARTS},
    }


class Instance:
    def __init__(self, broker: FakeBroker, name: str, clock: Clock) -> None:
        config = settings_from_dict(settings(name))
        self.consumer = FakeConsumer(broker)
        inputs = {(SOURCE, p) for p in range(INPUTS)}
        self.processor = StreamProcessor(
            self.consumer, FakeSink(broker), build_two_stages(config, inputs),
            topics=[SOURCE, REPARTITION], processing=config.processing, clock=clock)
        self.processor.subscribe()


def batch(rng: random.Random, start_ms: int, rows: int) -> pa.Table:
    return pa.table({
        "site": [rng.choice(SITES) for _ in range(rows)],
        "ts": pa.array([start_ms + rng.randrange(SIZE_MS // 2) for _ in range(rows)],
                       pa.timestamp("ms", "UTC")),
        "reading": [rng.uniform(-10, 10) for _ in range(rows)],
        "reading_max": [rng.uniform(0, 100) for _ in range(rows)],
    })


def test_two_instances_emit_each_group_once_and_every_window_whole() -> None:
    broker = FakeBroker()
    broker.create_topic(SOURCE, INPUTS)
    broker.create_topic(REPARTITION, PARTS)
    broker.create_topic(SINK)
    clock = Clock()
    a, b = Instance(broker, "a", clock), Instance(broker, "b", clock)
    a.consumer.rebalance("assign", [(SOURCE, 0), (SOURCE, 1), (REPARTITION, 0)])
    b.consumer.rebalance("assign", [(SOURCE, 2), (SOURCE, 3), (REPARTITION, 1),
                                    (REPARTITION, 2)])
    rng = random.Random(4)
    sent = []
    for window in range(6):  # every worker writes every group, in event-time order
        for partition in range(INPUTS):
            table = batch(rng, window * SIZE_MS, 50)
            sent.append(table)
            broker.produce(SOURCE, partition, encode_ipc_stream(table))
    for _ in range(80):  # until every partition has been idle long enough to close all
        a.processor.run_once()
        b.processor.run_once()
        clock.now_ms += 100

    messages = [decode_message(m.value(), m.headers()) for m in broker.topics[SINK][0]]
    data = [m for m in messages if isinstance(m, OutputWindow)]
    ends = [m for m in messages if isinstance(m, WindowEnd)]
    got = pl.concat([w.frame for w in data]).with_columns(
        pl.col("window_start").dt.epoch("ms")).drop("window_end")
    rows = pl.concat([pl.DataFrame(t) for t in sent])
    expected = rows.group_by(
        (pl.col("ts").dt.epoch("ms") // SIZE_MS * SIZE_MS).alias("window_start"), "site",
    ).agg(pl.col("reading").sum(), pl.col("reading_max").max(),
          pl.len().cast(pl.Int64).alias("row_count"))
    columns = ["window_start", "site", "reading", "reading_max", "row_count"]
    assert_frame_equal(got.select(columns).with_columns(pl.col("site").cast(pl.String))
                       .sort("window_start", "site"),
                       expected.select(columns).sort("window_start", "site"),
                       check_exact=False, rel_tol=1e-9)
    assert all(w.final and w.part is not None for w in data)
    by_window: dict[int, list[WindowEnd]] = {}
    for end in ends:
        by_window.setdefault(end.start_ms, []).append(end)
    assert sorted(by_window) == [w * SIZE_MS for w in range(6)]
    for start, parts in by_window.items():
        assert sorted(e.part for e in parts) == [(k, PARTS) for k in range(1, PARTS + 1)]
        assert sum(e.rows for e in parts) == got.filter(pl.col("window_start") == start).height
        assert sum(e.input_rows for e in parts) == 4 * 50
