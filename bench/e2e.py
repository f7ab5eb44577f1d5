"""End to end through the real broker: a pre-filled topic, drained by two kinds of reader.

- the daemon (``StreamProcessor``, the shipped defaults): from its partition assignment
  until every window of the data is committed to the output topic;
- a raw confluent-kafka consumer with the daemon's consumer settings that only reads
  (the practical ceiling), from its assignment to its last message;
- the floors of any daemon on this machine: the daemon's own pipeline over the same
  messages with no broker at all (``run_pipeline_alone``), and a prefetching run loop
  (``run_overlapped``: a thread reading as the raw consumer does, handing its polls to
  that pipeline in this thread, so reading the next poll overlaps aggregating this one;
  no transactions);
- the floor of any Polars reader (``run_polars_reader``): the raw consumer's loop, each
  poll read by pyarrow without validation and grouped by one streaming Polars
  ``group_by``, the partials merged and every window encoded as arrowagg encodes its own
  once the last message is read; no transactions. What Polars itself takes for the job
  on this machine, measured whole.

The peers a user would pick instead of arrowagg run the whole job in ``bench.peers``.

A one-row sentinel per partition, in a far later window, closes every window of the
data, so no reader waits for an idle timeout.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer
from pyarrow import ipc

from bench.broker import create_topic, delete_topics, fill
from bench.kernel import schema_of
from bench.payloads import WINDOW_MS, Encoding, Payloads, build, sentinel
from bench.polars_floor import encoded_windows, grouped_polls
from bench.read_ahead import read_ahead
from bench.sizes import KernelCase
from consumer.compose import build_pipeline, build_processor
from consumer.config import Settings, settings_from_dict
from consumer.core.plan import derive_plan
from consumer.core.types import ClosedWindow, InputMessage, PartitionKey
from consumer.kafka.clients import consumer_config, take_batch
from consumer.service.observer import NullObserver

ROWS_PER_MESSAGE = 12_000  # ~1 MB a message: what the publisher's default limit makes
GROUPS = 10_000
MESSAGES_PER_WINDOW = 50


@dataclass
class Topic:
    name: str
    payloads: Payloads
    partitions: int
    messages: int  # sentinels included
    nbytes: int
    windows: int


def prepare(bootstrap: str, encoding: Encoding, target_bytes: int, partitions: int,
            *, rows_per_message: int = ROWS_PER_MESSAGE, groups: int = GROUPS,
            messages_per_window: int = MESSAGES_PER_WINDOW) -> Topic:
    """A topic holding at least ``target_bytes`` of input, messages spread round-robin."""
    probe = build(KernelCase("probe", 1, rows_per_message, groups, 1), encoding)
    messages = max(math.ceil(target_bytes / probe.nbytes), messages_per_window)
    messages = math.ceil(messages / messages_per_window) * messages_per_window
    case = KernelCase(f"e2e {encoding}", messages, rows_per_message, groups,
                      messages_per_window)
    payloads = build(case, encoding)
    name = create_topic(bootstrap, f"e2e-{encoding}", partitions)
    last = sentinel(encoding, payloads.windows + 10)
    values = [(i % partitions, v) for i, v in enumerate(payloads.values)]
    fill(bootstrap, name, [*values, *((p, last) for p in range(partitions))])
    return Topic(name, payloads, partitions, messages + partitions,
                 payloads.nbytes + partitions * len(last), payloads.windows)


def daemon_settings(bootstrap: str, topic: str, output: str, **processing: Any) -> Settings:
    return settings_from_dict({
        "kafka": {"bootstrap_servers": bootstrap, "group_id": f"bench-{uuid.uuid4().hex[:8]}"},
        "input": {"topics": [topic]},
        "output": {"topic": output},
        "window": {"kind": "tumbling", "time": "event", "timestamp_column": "ts",
                   "size_ms": WINDOW_MS},
        "processing": {"instance_id": f"bench-{uuid.uuid4().hex[:8]}", **processing},
        "service": {"http_port": None, "statistics_interval_ms": 0},
    })


@dataclass
class Watch(NullObserver):
    """Times the first consumed message and every committed window."""

    assigned_at: float | None = None
    first_consumed: float | None = None
    windows: int = 0
    last_commit: float | None = None
    polls: int = 0
    messages: int = 0
    committed_at: list[tuple[ClosedWindow, int, int]] = field(default_factory=list)

    def assigned(self, partitions: Sequence[PartitionKey]) -> None:
        if self.assigned_at is None and partitions:
            self.assigned_at = time.perf_counter()

    def consumed(self, partition: PartitionKey, messages: int, rows: int,  # noqa: ARG002
                 nbytes: int) -> None:  # noqa: ARG002
        if self.first_consumed is None:
            self.first_consumed = time.perf_counter()
        self.messages += messages

    def loop_turned(self, now_ms: int) -> None:  # noqa: ARG002
        self.polls += 1

    def committed(self, windows: Sequence[ClosedWindow], closed_at_ms: int,
                  committed_at_ms: int) -> None:
        if windows:
            self.windows += len(windows)
            self.last_commit = time.perf_counter()
            self.committed_at += [(w, closed_at_ms, committed_at_ms) for w in windows]


class DaemonThread:
    """``StreamProcessor.run`` in a thread, as tests/integration/conftest.py runs it."""

    def __init__(self, settings: Settings, watch: Watch) -> None:
        self.processor = build_processor(settings, watch)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="bench-daemon", daemon=True)

    def _run(self) -> None:
        try:
            self.processor.run()
        except BaseException as err:  # noqa: BLE001 - handed to the bench thread
            self.error = err

    def __enter__(self) -> DaemonThread:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.processor.request_stop()
        self._thread.join(120)
        if self.error is not None:
            raise self.error

    def alive(self) -> bool:
        return self._thread.is_alive()


def run_daemon(bootstrap: str, topic: Topic, *, timeout_s: float = 600) -> dict[str, Any]:
    output = create_topic(bootstrap, "out", 1)
    watch = Watch()
    try:
        with DaemonThread(daemon_settings(bootstrap, topic.name, output), watch) as daemon:
            deadline = time.monotonic() + timeout_s
            while watch.windows < topic.windows:
                if not daemon.alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"daemon emitted {watch.windows}/{topic.windows} windows")
                time.sleep(0.01)
    finally:
        delete_topics(bootstrap, [output])
    assert watch.assigned_at is not None  # noqa: S101
    assert watch.last_commit is not None  # noqa: S101
    seconds = watch.last_commit - watch.assigned_at
    return _rates(topic, seconds, {"windows": watch.windows,
                                   "messages_per_poll": watch.messages / max(watch.polls, 1)})


def _subscribed(bootstrap: str, topic: Topic) -> tuple[Consumer, list[float]]:
    """A consumer with the daemon's settings, subscribed to ``topic`` in a fresh group,
    and the list its assignment time will be appended to (where every reader's clock
    starts)."""
    settings = daemon_settings(bootstrap, topic.name, "unused")
    consumer = Consumer({k: v for k, v in consumer_config(settings.kafka, settings.processing)
                         .items() if k != "logger"})
    assigned: list[float] = []
    consumer.subscribe([topic.name],
                       on_assign=lambda _c, _p: assigned.append(time.perf_counter()))
    return consumer, assigned


def run_raw(bootstrap: str, topic: Topic, *, batch: int, like_daemon: bool = False,
            ) -> dict[str, Any]:
    """Read every message with ``consume(batch, 0.2)`` (or, ``like_daemon``, the daemon's
    own ``take_batch``); touch only its length."""
    consumer, first = _subscribed(bootstrap, topic)
    seen = nbytes = 0
    try:
        while seen < topic.messages:
            messages = (take_batch(consumer, batch, 0.2) if like_daemon
                        else consumer.consume(batch, 0.2))
            for message in messages:
                if message.error() is not None:
                    continue
                seen += 1
                nbytes += len(message.value() or b"")
        last = time.perf_counter()
    finally:
        consumer.close()
    return _rates(topic, last - first[0], {"bytes_read": nbytes})


def run_overlapped(bootstrap: str, topic: Topic, *, batch: int = 500) -> dict[str, Any]:
    """A reader thread (the daemon's consumer settings and ``take_batch``) and the
    daemon's pipeline (decode, window, aggregate, close, encode) on its polls in this
    thread, two polls of prefetch between them; from the assignment to the last window
    encoded. The output is not produced and nothing is committed."""
    consumer, first = _subscribed(bootstrap, topic)

    def polls() -> Iterator[list[InputMessage]]:
        seen = 0
        while seen < topic.messages:
            poll = [InputMessage((m.topic() or "", m.partition() or 0), m.offset() or 0,
                                 m.value())
                    for m in take_batch(consumer, batch, 0.2) if m.error() is None]
            seen += len(poll)
            if poll:
                yield poll

    try:
        with closing(read_ahead(polls())) as ahead:
            windows = _drive(topic, ahead)
        last = time.perf_counter()
    finally:
        consumer.close()
    return _rates(topic, last - first[0], {"windows": windows})


def run_polars_reader(bootstrap: str, topic: Topic, *, batch: int = 100) -> dict[str, Any]:
    """From the assignment to the last window encoded: a reader thread reads each
    ``consume(batch, 0.2)`` with pyarrow and hands it over (two polls of prefetch); this
    thread groups each poll, then merges the partials and encodes the windows. The
    fastest of the shapes tried (polls of 100, 300 or 500 messages grouped as they come,
    in this thread or behind a reader thread; everything read first and grouped once)."""
    consumer, first = _subscribed(bootstrap, topic)

    def polls() -> Iterator[list[pa.Table]]:
        seen = 0
        while seen < topic.messages:
            tables = [ipc.open_stream(m.value()).read_all()
                      for m in consumer.consume(batch, 0.2) if m.error() is None]
            seen += len(tables)
            if tables:
                yield tables

    plan = derive_plan(schema_of(topic.payloads.values[0]), time_column="ts")
    try:
        with closing(read_ahead(polls())) as ahead:
            merged = grouped_polls(ahead, plan)
        windows = encoded_windows(merged)
        last = time.perf_counter()
    finally:
        consumer.close()
    rows_seen = merged.get_column("row_count").sum()
    if rows_seen != topic.payloads.rows + topic.partitions:  # the data and the sentinels
        raise RuntimeError(f"the Polars reader grouped {rows_seen} rows of "
                           f"{topic.payloads.rows + topic.partitions}")
    return _rates(topic, last - first[0], {"windows": len(windows)})


def run_pipeline_alone(topic: Topic, *, poll_messages: int = 128) -> dict[str, Any]:
    """The daemon's pipeline over the topic's messages, in their order and in polls of
    ``poll_messages`` (the daemon's polls hold ~120 here), with no broker at all: the
    work any daemon must do, whatever overlaps it with reading."""
    last = sentinel(topic.payloads.encoding, topic.payloads.windows + 10)
    values = [*topic.payloads.values, *([last] * topic.partitions)]
    messages = [InputMessage((topic.name, i % topic.partitions), i // topic.partitions, value)
                for i, value in enumerate(values)]
    polls = [messages[i:i + poll_messages] for i in range(0, len(messages), poll_messages)]
    start = time.perf_counter()
    windows = _drive(topic, iter(polls))
    return _rates(topic, time.perf_counter() - start, {"windows": windows})


def _drive(topic: Topic, polls: Iterator[list[InputMessage]]) -> int:
    """The daemon's pipeline, its flushes counted as committed at once, over ``polls`` of
    ``topic``; checks every window of the data closed with every row in it."""
    pipeline = build_pipeline(daemon_settings("unused:9092", topic.name, "unused"))
    for partition in range(topic.partitions):
        pipeline.assign((topic.name, partition), None, None, 0)
    windows = rows = 0
    for poll in polls:
        now_ms = time.time_ns() // 1_000_000
        pipeline.process(poll, now_ms)
        flush = pipeline.flush(now_ms)
        if flush.commit:
            pipeline.committed(flush, now_ms)
            windows += len(flush.windows)
            rows += sum(w.input_rows for w in flush.windows)
    if (windows, rows) != (topic.windows, topic.payloads.rows):
        raise RuntimeError(f"the pipeline emitted {windows}/{topic.windows} windows "
                           f"of {rows}/{topic.payloads.rows} rows")
    return windows


def _rates(topic: Topic, seconds: float, extra: dict[str, Any]) -> dict[str, Any]:
    return {"seconds": seconds, "rows": topic.payloads.rows, "bytes": topic.nbytes,
            "rows_per_s": topic.payloads.rows / seconds, "mb_per_s": topic.nbytes / seconds / 1e6,
            **extra}
