"""The publisher and ``python -m producer`` against the real broker: what is sent comes back."""

from __future__ import annotations

import uuid
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, Message
from polars.testing import assert_frame_equal

from producer import cli
from producer.generate import sensor_batch
from producer.publisher import Publisher, PublishError
from tests.conftest import TopicFactory
from wire.input import decode_ipc_stream, dictionary_keys, parse_headers, schema_fingerprint

pytestmark = pytest.mark.integration

TOPIC_LIMIT = 200_000  # the topics' max.message.bytes, small so that big tables must split


def small_topic(topic_factory: TopicFactory) -> str:
    return topic_factory("publisher", partitions=1, config={"max.message.bytes": str(TOPIC_LIMIT)})


def consume_all(bootstrap: str, topic: str, count: int) -> list[Message]:
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}",
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
    })
    consumer.subscribe([topic])
    received: list[Message] = []
    try:
        for _ in range(60):
            for message in consumer.consume(num_messages=500, timeout=1.0):
                assert message.error() is None
                received.append(message)
            if len(received) >= count:
                break
    finally:
        consumer.close()
    assert len(received) == count
    return received


def frame(table: pa.Table) -> pl.DataFrame:
    """The rows as values: the publisher sends strings dictionary-encoded by default,
    which read back as categoricals; what must survive is the strings."""
    result = pl.from_arrow(table)
    assert isinstance(result, pl.DataFrame)
    return result.with_columns(pl.col(pl.Categorical).cast(pl.String))


def test_tables_batches_and_frames_come_back_with_their_headers(
    bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = small_topic(topic_factory)
    table = sensor_batch(rows=500, groups=20, start_ms=0, span_ms=1_000, seed=1)
    batch = sensor_batch(rows=300, groups=7, start_ms=0, span_ms=1_000, seed=2).to_batches()[0]
    polars_frame = pl.DataFrame({"name with spaces": ["\u03b1", 'q"uote', None],
                                 "n": [1, 2, 3]})
    big = sensor_batch(rows=30_000, groups=100, start_ms=0, span_ms=60_000, seed=3)
    with Publisher(bootstrap_servers=bootstrap, topic=topic, producer_id="it-worker",
                   compression="lz4", max_message_bytes=TOPIC_LIMIT) as publisher:
        assert publisher.check_topic(timeout_s=10) == 1
        counts = [publisher.publish(table, key=b"k"), publisher.publish(batch),
                  publisher.publish(polars_frame)]
        counts.append(publisher.publish(big))
    assert counts[:3] == [1, 1, 1]
    assert counts[3] > 1  # ~2.4 MB of rows cannot fit in 200 kB messages
    assert publisher.delivered == publisher.sent == sum(counts)

    messages = consume_all(bootstrap, topic, sum(counts))
    headers = [parse_headers(message.headers()) for message in messages]
    assert [h.sequence for h in headers] == list(range(sum(counts)))
    assert {h.producer_id for h in headers} == {"it-worker"}
    assert all(len(message.value() or b"") <= TOPIC_LIMIT for message in messages)
    assert messages[0].key() == b"k"
    decoded = [decode_ipc_stream(message.value()) for message in messages]

    assert headers[0].schema_fingerprint == schema_fingerprint(dictionary_keys(table).schema)
    assert headers[0].chunk is None
    assert_frame_equal(frame(decoded[0]), frame(table))
    assert_frame_equal(frame(decoded[1]), frame(pa.Table.from_batches([batch])))
    assert_frame_equal(frame(decoded[2]), polars_frame)

    pieces = len(messages) - 3
    assert [h.chunk for h in headers[3:]] == [(i, pieces) for i in range(1, pieces + 1)]
    big_fingerprint = schema_fingerprint(dictionary_keys(big).schema)
    assert {h.schema_fingerprint for h in headers[3:]} == {big_fingerprint}
    assert_frame_equal(frame(pa.concat_tables(decoded[3:])), frame(big))


def test_a_parquet_file_is_published_batch_by_batch(
    bootstrap: str, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    topic = small_topic(topic_factory)
    table = sensor_batch(rows=1_000, groups=10, start_ms=0, span_ms=1_000, seed=4)
    pq.write_table(table, tmp_path / "readings.parquet", row_group_size=400)
    with Publisher(bootstrap_servers=bootstrap, topic=topic,
                   max_message_bytes=TOPIC_LIMIT) as publisher:
        sent = publisher.publish_ipc_file(tmp_path / "readings.parquet")
    messages = consume_all(bootstrap, topic, sent)
    received = pa.concat_tables([decode_ipc_stream(message.value()) for message in messages])
    assert_frame_equal(frame(received), frame(table))


def test_a_topic_smaller_than_max_message_bytes_fails_flush_with_the_mend(
    bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = small_topic(topic_factory)
    big = sensor_batch(rows=10_000, groups=10, start_ms=0, span_ms=1_000, seed=5)
    publisher = Publisher(bootstrap_servers=bootstrap, topic=topic, max_message_bytes=1_000_000)
    publisher.publish(big)
    with pytest.raises(PublishError, match=r"max\.message\.bytes"):
        publisher.close()


def test_the_cli_publishes_files_and_generated_batches(
    bootstrap: str, topic_factory: TopicFactory, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic = small_topic(topic_factory)
    out = tmp_path / "batches.arrows"
    assert cli.main(["generate", "--out", str(out), "--batches", "3", "--rows-per-batch", "200",
                     "--start-ms", "0"]) == 0
    common = ["--topic", topic, "--bootstrap-servers", bootstrap,
              "--max-message-bytes", str(TOPIC_LIMIT)]
    assert cli.main(["publish", *common, "--repeat", "2", "--compression", "zstd", str(out)]) == 0
    assert cli.main(["generate", *common, "--batches", "4", "--producers", "2",
                     "--rows-per-batch", "100"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[1].startswith("published 6 messages (6 batches, 1,200 rows, ")
    assert printed[2].startswith("published 4 messages (4 batches, 400 rows, ")
    messages = consume_all(bootstrap, topic, 10)
    producers = {parse_headers(message.headers()).producer_id for message in messages}
    assert len(producers) == 3  # one for publish, two for generate --producers 2


def test_the_cli_reports_a_missing_topic_in_one_line(
    bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "one.arrows"
    assert cli.main(["generate", "--out", str(out), "--batches", "1"]) == 0
    capsys.readouterr()
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    code = cli.main(["publish", "--topic", missing, "--bootstrap-servers", bootstrap, str(out)])
    err = capsys.readouterr().err
    assert code == 1, "the broker lacks the topic: not a mistake in the command"
    expected = (f"producer: topic {missing!r} does not exist on {bootstrap}; "
                "create it first or check the topic name")
    assert err.splitlines() == [expected]


def test_a_max_message_bytes_too_small_for_a_row_is_one_line_with_the_minimum(
    bootstrap: str, topic_factory: TopicFactory, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic = topic_factory("tiny")
    out = tmp_path / "rows.arrows"
    assert cli.main(["generate", "--out", str(out), "--batches", "2", "--start-ms", "0"]) == 0
    capsys.readouterr()
    code = cli.main(["publish", "--topic", topic, "--bootstrap-servers", bootstrap,
                     "--max-message-bytes", "2000", str(out)])
    [line] = capsys.readouterr().err.splitlines()
    assert code == 2
    assert line.startswith(f"producer: {out}: one row encodes to ")
    needed = int(line.split("raise it to at least ")[1].split()[0])
    assert needed > 2000
    assert cli.main(["publish", "--topic", topic, "--bootstrap-servers", bootstrap,
                     "--max-message-bytes", str(needed), str(out)]) == 0


def test_a_truncated_file_says_how_much_was_sent_before_it_failed(
    bootstrap: str, topic_factory: TopicFactory, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic = topic_factory("truncated")
    whole = tmp_path / "whole.arrows"
    assert cli.main(["generate", "--out", str(whole), "--batches", "4", "--rows-per-batch",
                     "1000", "--start-ms", "0"]) == 0
    batches = pa.ipc.open_stream(pa.OSFile(str(whole))).read_all().to_batches()
    cut = tmp_path / "cut.arrows"
    size = whole.stat().st_size
    cut.write_bytes(whole.read_bytes()[: size - size // 8])  # into the fourth batch
    capsys.readouterr()
    code = cli.main(["publish", "--topic", topic, "--bootstrap-servers", bootstrap, str(cut)])
    [line] = capsys.readouterr().err.splitlines()
    assert code == 2
    assert line.startswith(f"producer: {cut}: cannot read it as arrow-stream (")
    assert line.endswith("; before that, 3 batches (3,000 rows; 3 of 3 messages delivered) "
                         f"had already been sent to topic {topic!r}")
    sent = consume_all(bootstrap, topic, 3)
    got = pa.Table.from_batches([decode_ipc_stream(m.value()).to_batches()[0] for m in sent])
    assert_frame_equal(frame(got), frame(pa.Table.from_batches(batches[:3])))
