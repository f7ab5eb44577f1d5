"""The whole chain works: Maven jars -> Apache Kafka -> confluent-kafka -> Arrow IPC."""

from __future__ import annotations

import uuid

import polars as pl
import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer
from polars.testing import assert_frame_equal

from tests.conftest import TopicFactory
from tests.integration.faults import read_topic

pytestmark = pytest.mark.integration


def _ipc_stream(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def test_arrow_ipc_round_trips_through_a_consumer_group(
    bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = topic_factory("roundtrip", partitions=3)
    tables = [
        pa.table({
            "sensor": pa.array([f"s{i}", "δ \"quoted\"", None], pa.string()),
            "value_sum": pa.array([i, 2 * i, 3 * i], pa.int64()),
            "temp_max": pa.array([0.5 * i, float("nan"), -1.0], pa.float64()),
        })
        for i in range(12)
    ]
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    delivered: list[int] = []
    for i, table in enumerate(tables):
        producer.produce(topic, _ipc_stream(table), key=str(i).encode(),
                         on_delivery=lambda err, _msg: delivered.append(0 if err else 1))
    assert producer.flush(30) == 0
    assert delivered == [1] * len(tables)

    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}",
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
    })
    consumer.subscribe([topic])
    received: dict[int, pa.Table] = {}
    try:
        for _ in range(60):
            for msg in consumer.consume(num_messages=100, timeout=1.0):
                assert msg.error() is None
                reader = pa.ipc.open_stream(msg.value())
                received[int(msg.key() or b"-1")] = reader.read_all()
            if len(received) == len(tables):
                break
    finally:
        consumer.close()
    assert sorted(received) == list(range(len(tables)))
    for i, table in enumerate(tables):
        assert received[i].schema == table.schema
        assert_frame_equal(pl.DataFrame(received[i]), pl.DataFrame(table))


def test_the_test_reader_reads_to_the_end_before_it_may_stop_on_quiet(
    bootstrap: str, topic_factory: TopicFactory
) -> None:
    # Its waits failed in a soak run with every record in: stopping on quiet alone, a
    # reader whose first fetch took longer than the quiet time returned nothing. With
    # no quiet time at all, it still reads every partition to its end (one left empty).
    topic = topic_factory("reader", partitions=3)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(5):
        producer.produce(topic, str(i).encode(), partition=i % 2)
    assert producer.flush(30) == 0
    records = read_topic(bootstrap, topic, 3, quiet_s=0.0)
    assert sorted(r.value for r in records) == [str(i).encode() for i in range(5)]
