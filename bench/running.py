"""How far behind the running value is: early results (``window.emit_every_ms``).

A producer sends ``messages_per_s`` messages a second, each stamped with the wall clock,
into windows of ``window_ms``; the daemon sends each open window's changed groups every
``emit_every_ms``. A ``read_committed`` reader keeps, per (window, group), the row count
of the latest provisional revision, so it knows at every provisional message how many
rows of the window the running value holds. The running value's age at that moment is
now minus the send time of the message that brought the window to that many rows (in
send order): what a dashboard reading the topic sees is that old. p50 and p99 over every
provisional message.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections import defaultdict
from itertools import accumulate
from typing import Any

import polars as pl
from confluent_kafka import Consumer, Producer, TopicPartition

from bench.broker import create_topic, delete_topics
from bench.e2e import DaemonThread, Watch, daemon_settings
from bench.latency import GROUPS, PARTITIONS, percentile
from producer.generate import sensor_batch
from wire.input import dictionary_keys, encode_ipc_stream
from wire.output import OutputWindow, decode_message


def measure(bootstrap: str, *, seconds: float, window_ms: int, emit_every_ms: int,
            messages_per_s: int, rows_per_message: int) -> dict[str, Any]:
    source = create_topic(bootstrap, "running-in", PARTITIONS)
    output = create_topic(bootstrap, "running-out", 1)
    sent: dict[int, list[tuple[float, int]]] = defaultdict(list)  # window -> (sent, rows)
    seen: list[tuple[float, OutputWindow]] = []
    stop = threading.Event()
    reader = threading.Thread(target=_read, args=(bootstrap, output, seen, stop))
    settings = daemon_settings(bootstrap, source, output)
    settings = settings.model_copy(update={"window": settings.window.model_copy(
        update={"size_ms": window_ms, "emit_every_ms": emit_every_ms})})
    try:
        with DaemonThread(settings, Watch()):
            reader.start()
            _produce(bootstrap, source, sent, seconds=seconds, per_s=messages_per_s,
                     rows=rows_per_message, window_ms=window_ms)
            time.sleep(emit_every_ms / 1000 + 1.5)
            stop.set()
            reader.join(30)
    finally:
        stop.set()
        delete_topics(bootstrap, [source, output])
    ages = _ages(seen, sent)
    if not ages:
        raise RuntimeError("no provisional revision was read back; the run saw no output")
    return {"window_ms": window_ms, "emit_every_ms": emit_every_ms,
            "provisional_messages": len(ages), "p50_ms": percentile(ages, 50),
            "p99_ms": percentile(ages, 99), "max_ms": max(ages)}


def _produce(bootstrap: str, topic: str, sent: dict[int, list[tuple[float, int]]], *,
             seconds: float, per_s: int, rows: int, window_ms: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0,
                         "enable.idempotence": True})
    started, index = time.time(), 0
    try:
        while time.time() - started < seconds:
            time.sleep(max(0.0, started + index / per_s - time.time()))
            now_ms = int(time.time() * 1000)
            table = sensor_batch(rows=rows, groups=GROUPS, start_ms=now_ms, span_ms=1,
                                 seed=index)
            producer.produce(topic, encode_ipc_stream(dictionary_keys(table)),
                             partition=index % PARTITIONS)
            sent[now_ms // window_ms * window_ms].append((time.time(), rows))
            producer.poll(0)
            index += 1
    finally:
        producer.flush(30)


def _read(bootstrap: str, topic: str, seen: list[tuple[float, OutputWindow]],
          stop: threading.Event) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-running-reader",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "fetch.wait.max.ms": 10})
    consumer.assign([TopicPartition(topic, 0, 0)])
    try:
        while not stop.is_set():
            message = consumer.poll(0.02)
            if message is None or message.error() is not None:
                continue
            decoded = decode_message(message.value(), message.headers())
            if isinstance(decoded, OutputWindow) and not decoded.final:
                seen.append((time.time(), decoded))
    finally:
        consumer.close()


def _ages(seen: list[tuple[float, OutputWindow]],
          sent: dict[int, list[tuple[float, int]]]) -> list[float]:
    """Each provisional message's running value's age, in ms (module docstring)."""
    latest: dict[int, dict[tuple[Any, ...], int]] = defaultdict(dict)
    ages = []
    for read_at, window in seen:
        keys = [c for c in window.frame.columns
                if c not in ("window_start", "window_end", "row_count")
                and window.frame.schema[c] in (pl.String, pl.Categorical)]
        for row in window.frame.select(*keys, "row_count").iter_rows():
            latest[window.start_ms][row[:-1]] = int(row[-1])
        messages = sent.get(window.start_ms, [])
        totals = list(accumulate(rows for _, rows in messages))
        held = sum(latest[window.start_ms].values())
        reached = bisect_left(totals, held)
        if reached < len(messages):
            ages.append((read_at - messages[reached][0]) * 1000)
    return ages


def sentence(run: dict[str, Any] | None) -> str:
    """The figures of a run, said after the latency table (empty without a run)."""
    if not isinstance(run, dict):
        return ""
    return (f"\n\nEarly results (`window.emit_every_ms: {run['emit_every_ms']}` on "
            f"{run['window_ms'] / 1000:g}-second windows): how old the running value is when "
            f"a subscriber reads a provisional revision, over {run['provisional_messages']} "
            f"of them: p50 {run['p50_ms']:.0f} ms, p99 {run['p99_ms']:.0f} ms, "
            f"max {run['max_ms']:.0f} ms (bench/running.py).")
