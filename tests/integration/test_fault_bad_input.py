"""Hostile input through Apache Kafka: 10,000 malformed messages of ten kinds interleaved
with good ones. Every malformed message lands in the DLQ exactly once with its origin and
reason; unusual but valid messages (null keys, NaN values, empty batches) are aggregated;
the daemon never stops; the good rows' aggregates equal the reference."""

from __future__ import annotations

import random
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import polars as pl
import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, Message, Producer
from polars.testing import assert_frame_equal

from consumer import __version__
from tests.conftest import TopicFactory
from tests.integration.conftest import daemon_settings, running_daemon, wait_for
from tests.integration.data import KEYS, T0, output_frame, reference, sensor_table
from tests.integration.faults import group_committed, read_topic, repeated_groups, write_figures
from wire.input import encode_ipc_stream, message_headers, schema_fingerprint

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 3
GOOD_PER_PARTITION = 400
SPAN_MS = 25
SIZE_MS = 1000
MAX_MESSAGE_BYTES = 64 * 1024
MAX_DECODED_BYTES = 256 * 1024
PROBE_SITE = "nan-probe"
# Last in every partition: moves the watermark past all the good rows, so every window
# closes on the watermark; its own window stays open and is not compared. Idleness is
# kept out of it (see test_fault_broker: a partition with a backlog is not idle).
SENTINEL_MS = T0 + (GOOD_PER_PARTITION * SPAN_MS // SIZE_MS + 2) * SIZE_MS
IDLE_TIMEOUT_MS = 120_000
DLQ_FIELDS = ("original-topic", "original-partition", "original-offset", "original-timestamp",
              "consumer-group", "error-class", "error-message", "daemon-version")

# kind -> (how many, the DLQ error class it must get)
MALFORMED: dict[str, tuple[int, str]] = {
    "random-bytes": (2000, "not-arrow-ipc"),
    "truncated-stream": (2000, "invalid-ipc"),
    "string-offsets-past-the-data": (750, "invalid-ipc"),
    "string-offsets-backwards": (750, "invalid-ipc"),
    "invalid-utf8": (1500, "invalid-ipc"),
    "key-column-missing": (1000, "schema-mismatch"),
    "string-for-a-float": (1000, "schema-mismatch"),
    "oversize": (100, "too-many-bytes"),
    "decompression-bomb": (400, "too-many-bytes"),
    "zero-byte-value": (500, "empty-stream"),
}


@dataclass
class Sent:
    kind: str
    partition: int
    value: bytes
    table: pa.Table | None = None  # the good ones' rows
    offset: int = -1
    timestamp_ms: int = -1


# -- malformed values ------------------------------------------------------------------


def truncated(rng: random.Random, table: pa.Table) -> bytes:
    """Cut inside the record batch message: a cut right after the schema, or at the end
    of the batch, would be a valid (shorter) stream."""
    whole = encode_ipc_stream(table)
    schema_end = 8 + struct.unpack("<i", whole[4:8])[0]
    return whole[:rng.randrange(schema_end + 1, len(whole) - 8)]


def corrupt_site_offsets(table: pa.Table, *, backwards: bool) -> bytes:
    """Patch the int32 offsets of the "site" column (every value "site-N", 6 bytes)."""
    whole = bytearray(encode_ipc_stream(table))
    start = bytes(whole).index(struct.pack("<5i", 0, 6, 12, 18, 24))
    if backwards:
        whole[start + 8:start + 12] = struct.pack("<i", 2)  # 0, 6, 2, ...
    else:
        end = start + 4 * table.num_rows
        whole[end:end + 4] = struct.pack("<i", 6 * table.num_rows + 100_000)
    return bytes(whole)


def invalid_utf8(table: pa.Table) -> bytes:
    raw = pa.array([b"ok", b"\xff\xfe not utf-8"] * (table.num_rows // 2 + 1),
                   pa.binary()).slice(0, table.num_rows)
    raw = pa.concat_arrays([raw])  # unsliced buffers, as a producer would send them
    forged = pa.Array.from_buffers(pa.string(), len(raw), raw.buffers())  # not validated
    return encode_ipc_stream(table.set_column(table.schema.get_field_index("sensor"),
                                              "sensor", forged))


def string_for_a_float(table: pa.Table) -> bytes:
    index = table.schema.get_field_index("reading_sum")
    column = pa.array([f"{v:.3f} kWh" for v in table.column(index).to_pylist()])
    return encode_ipc_stream(table.set_column(index, "reading_sum", column), "zstd")


def decompression_bomb(schema: pa.Schema, rows: int = 40_000) -> bytes:
    """The good schema, constant values: ~12 KB compressed, ~2.9 MB decoded."""
    def constant(kind: pa.DataType) -> object:
        if pa.types.is_string(kind):
            return ""
        if pa.types.is_timestamp(kind):
            return T0
        return False if pa.types.is_boolean(kind) else 0

    columns = [pa.array([constant(f.type)] * rows, f.type) for f in schema]
    return encode_ipc_stream(pa.Table.from_arrays(columns, schema=schema), "zstd")


def malformed_makers(rng: random.Random, template: pa.Table) -> dict[str, Callable[[], bytes]]:
    """Per kind, a maker of one malformed value; the fixed ones are encoded once."""
    fixed = {
        "string-offsets-past-the-data": corrupt_site_offsets(template, backwards=False),
        "string-offsets-backwards": corrupt_site_offsets(template, backwards=True),
        "invalid-utf8": invalid_utf8(template),
        "key-column-missing": encode_ipc_stream(template.drop_columns(["sensor"])),
        "string-for-a-float": string_for_a_float(template),
        "decompression-bomb": decompression_bomb(template.schema),
        "zero-byte-value": b"",
    }
    oversize = [encode_ipc_stream(sensor_table(rng, 1000, T0, SPAN_MS)) for _ in range(5)]
    return {
        "random-bytes": lambda: b"\x00" + rng.randbytes(rng.randrange(0, 2000)),
        "truncated-stream": lambda: truncated(rng, template),
        "oversize": lambda: rng.choice(oversize),
        **{kind: partial(bytes, value) for kind, value in fixed.items()},
    }


# -- valid but unusual good tables -----------------------------------------------------


def with_null_keys(rng: random.Random, table: pa.Table) -> pa.Table:
    key = rng.choice(KEYS)
    values = [None if rng.random() < 0.3 else v for v in table.column(key).to_pylist()]
    return table.set_column(table.schema.get_field_index(key), key,
                            pa.array(values, pa.string()))


def with_nans(rng: random.Random, table: pa.Table) -> pa.Table:
    # NaN only in summed columns: see nan_probe for why not in *_min/*_max.
    for name in ("reading_sum", "power"):
        values = [float("nan") if rng.random() < 0.2 else v
                  for v in table.column(name).to_pylist()]
        table = table.set_column(table.schema.get_field_index(name), name,
                                 pa.array(values, pa.float64()))
    return table


def nan_probe(at_ms: int) -> pa.Table:
    """One group whose *_min/*_max hold a NaN among numbers. DuckDB orders NaN above
    every number, so its MAX is NaN (and MIN ignores it); Polars' min/max, and so the
    daemon's, skip NaN. The two disagree on *_max: this group's min/max are reported,
    not compared, and NaN is kept out of every other group's *_min/*_max."""
    table = sensor_table(random.Random(0), 3, at_ms, 1)
    for key, value in zip(KEYS, (PROBE_SITE, "probe", "north"), strict=True):
        table = table.set_column(table.schema.get_field_index(key), key, pa.array([value] * 3))
    for name in ("reading_min", "reading_max"):
        table = table.set_column(table.schema.get_field_index(name), name,
                                 pa.array([-1.0, float("nan"), 1.0]))
    return table


def good_tables(rng: random.Random, partition: int) -> list[pa.Table]:
    tables = []
    for i in range(GOOD_PER_PARTITION):
        table = sensor_table(rng, rng.randrange(5, 40), T0 + i * SPAN_MS, SPAN_MS)
        roll = rng.random()
        if i > 0 and roll < 0.05:
            table = table.slice(0, 0)  # an empty batch: valid, no rows
        elif roll < 0.20:
            table = with_null_keys(rng, table)
        elif roll < 0.30:
            table = with_nans(rng, table)
        tables.append(table)
    if partition == 0:
        tables[GOOD_PER_PARTITION // 2] = nan_probe(T0 + GOOD_PER_PARTITION // 2 * SPAN_MS)
    return tables


def good_value(table: pa.Table, sequence: int) -> bytes:
    if table.num_rows == 0 and sequence % 2:
        # the other empty form: one record batch of zero rows (the writer sends none
        # for an empty table, only the schema)
        return encode_ipc_stream(pa.RecordBatch.from_pylist([], schema=table.schema))
    return encode_ipc_stream(table, "zstd")


def build_input(rng: random.Random) -> list[Sent]:
    """Per partition: good messages in event-time order, malformed ones spread among
    them (never first: the first decoded message fixes the aggregation plan)."""
    streams: list[list[Sent]] = []
    for partition in range(PARTITIONS):
        tables = good_tables(rng, partition)
        streams.append([Sent("good", partition, good_value(t, i), t)
                        for i, t in enumerate(tables)])
    makers = malformed_makers(rng, sensor_table(rng, 30, T0, SPAN_MS))
    for kind, (count, _error_class) in MALFORMED.items():
        for _ in range(count):
            partition = rng.randrange(PARTITIONS)
            stream = streams[partition]
            stream.insert(rng.randrange(1, len(stream) + 1),
                          Sent(kind, partition, makers[kind]()))
    for partition, stream in enumerate(streams):
        sentinel = sensor_table(rng, 1, SENTINEL_MS, 1)
        stream.append(Sent("sentinel", partition, good_value(sentinel, 0), sentinel))
    merged: list[Sent] = []
    cursors = [0] * PARTITIONS
    while any(c < len(s) for c, s in zip(cursors, streams, strict=True)):
        partition = rng.choice([p for p in range(PARTITIONS) if cursors[p] < len(streams[p])])
        merged.append(streams[partition][cursors[partition]])
        cursors[partition] += 1
    return merged


def publish(bootstrap: str, topic: str, messages: list[Sent]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                         "enable.idempotence": True})
    errors: list[str] = []

    def delivered(sent: Sent) -> Callable[[KafkaError | None, Message], None]:
        def callback(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                errors.append(err.str())
                return
            sent.offset = msg.offset() or 0
            sent.timestamp_ms = msg.timestamp()[1]
        return callback

    for sequence, sent in enumerate(messages):
        headers: list[tuple[str, str | bytes | None]] | None = None
        if sent.table is not None:
            headers = list(message_headers(fingerprint=schema_fingerprint(sent.table.schema),
                                           producer_id="bad-input", sequence=sequence))
        while True:
            try:
                producer.produce(topic, sent.value, partition=sent.partition,
                                 headers=headers, on_delivery=delivered(sent))
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert errors == []


def bomb_decoded_bytes(messages: list[Sent]) -> int:
    bomb = next(m.value for m in messages if m.kind == "decompression-bomb")
    return int(pa.ipc.open_stream(bomb).read_all().get_total_buffer_size())


def test_ten_thousand_malformed_messages_go_to_the_dlq_exactly_once(
    bootstrap: str, topic_factory: TopicFactory,
) -> None:
    source, sink = topic_factory("in", partitions=PARTITIONS), topic_factory("out")
    dlq = topic_factory("dlq")
    messages = build_input(random.Random(23))
    good = [m.table for m in messages if m.kind == "good" and m.table is not None]
    sizes = {kind: max(len(m.value) for m in messages if m.kind == kind) for kind in MALFORMED}
    assert sizes["decompression-bomb"] < MAX_MESSAGE_BYTES < min(
        len(m.value) for m in messages if m.kind == "oversize")
    settings = daemon_settings(
        bootstrap, source, sink,
        output={"dlq_topic": dlq},
        input={"max_message_bytes": MAX_MESSAGE_BYTES,
               "max_decoded_bytes_per_message": MAX_DECODED_BYTES},
        dlq_limit={"max_invalid_ratio": 1.0, "max_consecutive_invalid": 100_000,
                   "window_messages": 1000},
        window={"kind": "tumbling", "time": "event", "timestamp_column": "ts",
                "size_ms": SIZE_MS, "idle_timeout_ms": IDLE_TIMEOUT_MS},
        processing={"poll_max_messages": 1000})
    good_rows = sum(t.num_rows for t in good)
    with running_daemon(settings) as daemon:
        publish(bootstrap, source, messages)
        malformed = {(m.partition, m.offset): m for m in messages if m.kind in MALFORMED}
        assert len(malformed) == sum(count for count, _ in MALFORMED.values())
        sentinels = sorted((m.partition, m.offset) for m in messages if m.kind == "sentinel")
        counters = daemon.processor.counters
        wait_for(lambda: group_committed(bootstrap, settings.kafka.group_id, source,
                                         PARTITIONS) == [offset for _, offset in sentinels],
                 timeout_s=60, what="every window and dead letter before the sentinels committed")
        alive = daemon.thread.is_alive()
    assert alive, "the daemon thread stopped"
    assert daemon.error is None

    dead = read_topic(bootstrap, dlq, 1)
    origins = [(int(r.headers["arrowagg.dlq.original-partition"]),
                int(r.headers["arrowagg.dlq.original-offset"])) for r in dead]
    by_kind: Counter[tuple[str, str]] = Counter()
    for record, origin in zip(dead, origins, strict=True):
        sent = malformed[origin]
        headers = {k.removeprefix("arrowagg.dlq."): v.decode() for k, v in record.headers.items()
                   if k.startswith("arrowagg.dlq.")}
        assert set(DLQ_FIELDS) <= set(headers), sorted(headers)
        assert headers["original-topic"] == source
        assert headers["original-timestamp"] == str(sent.timestamp_ms)
        assert headers["consumer-group"] == settings.kafka.group_id
        assert headers["daemon-version"] == __version__
        assert headers["error-message"]
        assert record.value == sent.value
        by_kind[sent.kind, headers["error-class"]] += 1

    got, _starts = output_frame(bootstrap, sink)
    expected = reference(good, SIZE_MS)
    probe = pl.col("site").eq_missing(PROBE_SITE)
    extremes = ["reading_min", "reading_max"]
    probe_got = got.filter(probe).select(extremes).row(0)
    probe_expected = expected.filter(probe).select(extremes).row(0)
    classes = Counter(cls for (_kind, cls), n in by_kind.items() for _ in range(n))
    write_figures("bad_input", {
        "malformed_sent": len(malformed), "dlq_records": len(dead),
        "dlq_duplicates": len(origins) - len(set(origins)),
        "malformed_missing_from_dlq": len(set(malformed) - set(origins)),
        "by_error_class": dict(sorted(classes.items())),
        "by_kind": {kind: dict(sorted((c, n) for (k, c), n in by_kind.items() if k == kind))
                    for kind in MALFORMED},
        "largest_value_bytes": sizes,
        "bomb_decoded_bytes": bomb_decoded_bytes(messages),
        "good_messages": len(good), "good_rows": good_rows,
        "empty_good_messages": sum(1 for t in good if t.num_rows == 0),
        "rejected_counter": counters.rejected, "crashes": 0 if alive else 1,
        "late_rows": counters.late_rows,
        "output_rows": got.height, "duplicates": repeated_groups(got, KEYS),
        "nan_probe_min_max": {"daemon": probe_got, "duckdb": probe_expected},
    })
    print(f"{'kind':32} {'error class':18} {'count':>6}")
    for (kind, error_class), count in sorted(by_kind.items()):
        print(f"{kind:32} {error_class:18} {count:>6}")

    assert sorted(origins) == sorted(set(origins)), "a message was dead-lettered twice"
    assert set(origins) == set(malformed), "a malformed message is missing from the DLQ"
    for kind, (count, error_class) in MALFORMED.items():
        assert by_kind[kind, error_class] == count, (kind, by_kind)
    assert repeated_groups(got, KEYS) == 0
    assert counters.late_rows == 0
    assert int(got["row_count"].sum()) == good_rows
    assert_frame_equal(got.drop("window_end").drop(extremes).sort(["window_start", *KEYS]),
                       expected.drop(extremes), check_exact=False, rel_tol=1e-9,
                       abs_tol=1e-9, check_dtypes=False)
    assert_frame_equal(got.filter(~probe).drop("window_end").sort(["window_start", *KEYS]),
                       expected.filter(~probe), check_exact=False, rel_tol=1e-9,
                       abs_tol=1e-9, check_dtypes=False)
