"""Latency: from the moment a window can close to its result being readable.

A producer sends ``messages_per_s`` messages a second, round-robin over the partitions,
each stamped with the wall clock as its event time. A window [start, end) can close once
every partition has received a message at or past ``end`` (the watermark, with the
default ``allowed_lateness_ms: 0``): that send time is the close time. A
``read_committed`` reader on the output topic notes when each window's last chunk
arrives: that is when it is readable. The daemon runs with the shipped defaults.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import defaultdict
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from bench.broker import create_topic, delete_topics
from bench.e2e import DaemonThread, Watch, daemon_settings
from producer.generate import sensor_batch
from wire.input import HEADER_CHUNK, dictionary_keys, encode_ipc_stream
from wire.output import HEADER_WINDOW_END

PARTITIONS = 4
GROUPS = 1_000
WARMUP_WINDOWS = 2


def measure(bootstrap: str, *, seconds: float, window_ms: int, messages_per_s: int,
            rows_per_message: int, processing: dict[str, Any] | None = None,
            consumer: dict[str, Any] | None = None) -> dict[str, Any]:
    """p50/p99 of close -> readable; ``processing``/``consumer`` override the defaults."""
    source = create_topic(bootstrap, "latency-in", PARTITIONS)
    output = create_topic(bootstrap, "latency-out", 1)
    sent: dict[int, list[tuple[int, float]]] = defaultdict(list)  # partition -> (ts, sent)
    readable: dict[int, float] = {}
    stop = threading.Event()
    reader = threading.Thread(target=_read, args=(bootstrap, output, readable, stop))
    watch = Watch()
    settings = daemon_settings(bootstrap, source, output, **(processing or {}))
    settings = settings.model_copy(update={
        "window": settings.window.model_copy(update={"size_ms": window_ms}),
        "kafka": settings.kafka.model_copy(update={"consumer": consumer or {}}),
    })
    try:
        with DaemonThread(settings, watch):
            reader.start()
            _produce(bootstrap, source, sent, seconds=seconds, per_s=messages_per_s,
                     rows=rows_per_message)
            time.sleep(2 * window_ms / 1000 + 1.5)
            stop.set()
            reader.join(30)
    finally:
        stop.set()
        delete_topics(bootstrap, [source, output])
    return _summary(sent, readable, window_ms, watch)


def _produce(bootstrap: str, topic: str, sent: dict[int, list[tuple[int, float]]], *,
             seconds: float, per_s: int, rows: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all",
                         "enable.idempotence": True})
    interval = 1 / per_s
    started = time.time()
    index = 0
    try:
        while time.time() - started < seconds:
            due = started + index * interval
            time.sleep(max(0.0, due - time.time()))
            now_ms = int(time.time() * 1000)
            table = sensor_batch(rows=rows, groups=GROUPS, start_ms=now_ms, span_ms=1,
                                 seed=index)
            partition = index % PARTITIONS
            producer.produce(topic, encode_ipc_stream(dictionary_keys(table)),
                             partition=partition)
            sent[partition].append((now_ms, time.time()))
            producer.poll(0)
            index += 1
    finally:
        producer.flush(30)


def _read(bootstrap: str, topic: str, readable: dict[int, float], stop: threading.Event) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-latency-reader",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "fetch.wait.max.ms": 10})
    consumer.assign([TopicPartition(topic, 0, 0)])
    try:
        while not stop.is_set():
            message = consumer.poll(0.02)
            if message is None or message.error() is not None:
                continue
            raw = message.headers() or []
            pairs = raw.items() if isinstance(raw, dict) else raw
            headers = {key: value.decode() if isinstance(value, bytes) else str(value)
                       for key, value in pairs}
            index, _, count = headers.get(HEADER_CHUNK, "1/1").partition("/")
            if index == count:
                readable[int(headers[HEADER_WINDOW_END])] = time.time()
    finally:
        consumer.close()


def _closable_at(end_ms: int, sent: dict[int, list[tuple[int, float]]]) -> float | None:
    """When the last partition got its first message at or past ``end_ms``."""
    firsts = []
    for messages in sent.values():
        past = [at for ts, at in messages if ts >= end_ms]
        if not past:
            return None
        firsts.append(min(past))
    return max(firsts) if len(firsts) == PARTITIONS else None


def _summary(sent: dict[int, list[tuple[int, float]]], readable: dict[int, float],
             window_ms: int, watch: Watch) -> dict[str, Any]:
    ends = sorted(readable)[WARMUP_WINDOWS:]
    latencies = []
    for end in ends:
        closable = _closable_at(end, sent)
        if closable is not None:
            latencies.append((readable[end] - closable) * 1000)
    inside = [float(committed - closed) for _w, closed, committed in watch.committed_at]
    if not latencies:
        raise RuntimeError("no window was read back; the latency run saw no output")
    return {
        "windows": len(latencies), "window_ms": window_ms,
        "p50_ms": percentile(latencies, 50), "p99_ms": percentile(latencies, 99),
        "max_ms": max(latencies),
        "close_to_commit_p50_ms": percentile(inside, 50) if inside else None,
        "latencies_ms": latencies,
    }


def percentile(values: list[float], q: int) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]
