"""The daemon as a service through Apache Kafka: /readyz turns 200 only after the
assignment, /metrics follows the run (lag, windows, DLQ, rows) and agrees with the input
and the processor's own counters."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from confluent_kafka import Producer

from consumer.core.types import PartitionKey
from consumer.service.fanout import start_service
from consumer.service.observer import NullObserver
from tests.conftest import TopicFactory
from tests.consumer.service.probes import Samples, http_get, scrape, total
from tests.integration.conftest import (
    daemon_settings,
    publish_tables,
    running_daemon,
    wait_all_committed,
    wait_for,
)
from tests.integration.data import T0, sensor_table

pytestmark = pytest.mark.integration

POISON = [b"not arrow", b"\xff" * 64, b"ARROW1\x00\x00garbage"]


class SlowDaemon(NullObserver):
    """Makes the daemon take ``delay_s`` per message, so a backlog (lag) can be seen, and
    notes when the first assignment arrived."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.assigned_at: float | None = None

    def assigned(self, partitions: Sequence[PartitionKey]) -> None:
        if partitions and self.assigned_at is None:
            self.assigned_at = time.monotonic()

    def consumed(self, partition: PartitionKey, messages: int,  # noqa: ARG002 - the hook's
                 rows: int, nbytes: int) -> None:  # noqa: ARG002 - signature
        time.sleep(self.delay_s * messages)


@dataclass
class Watcher:
    """Polls /readyz and /metrics from another thread, as Kubernetes and Prometheus do."""

    port: int
    readyz: list[tuple[float, int]] = field(default_factory=list)
    lags: list[float] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            self.readyz.append((time.monotonic(), http_get(self.port, "/readyz")[0]))
            samples = scrape(self.port)
            if any(name == "arrowagg_consumer_lag" for name, _ in samples):
                self.lags.append(total(samples, "arrowagg_consumer_lag"))
            time.sleep(0.03)


def settled(samples: Samples) -> bool:
    """Caught up: no open window, ready, and a lag reported for both partitions, 0."""
    lags = [value for (name, _), value in samples.items() if name == "arrowagg_consumer_lag"]
    return (total(samples, "arrowagg_windows_open") == 0
            and total(samples, "arrowagg_ready") == 1 and lags == [0, 0])


def test_metrics_and_readiness_follow_a_real_run(
        bootstrap: str, topic_factory: TopicFactory) -> None:
    source, sink = topic_factory("in", partitions=2), topic_factory("out")
    dlq = topic_factory("dlq")
    rng = random.Random(11)
    # 60 messages per partition over 3 s of event time; published before the daemon
    # starts, so it begins with a backlog.
    tables = [(i % 2, sensor_table(rng, 30, T0 + (i // 2) * 50, 50)) for i in range(120)]
    publish_tables(bootstrap, source, tables)
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in POISON:
        producer.produce(source, value, partition=1)
    assert producer.flush(10) == 0
    settings = daemon_settings(
        bootstrap, source, sink, output={"dlq_topic": dlq},
        window={"kind": "tumbling", "time": "event", "timestamp_column": "ts",
                "size_ms": 1000, "idle_timeout_ms": 1000},
        processing={"poll_max_messages": 1},
        service={"http_port": 0, "statistics_interval_ms": 100})
    slow = SlowDaemon(delay_s=0.015)
    service = start_service(settings.service, {}, others=[slow])
    assert service.health is not None
    watcher = Watcher(service.health.port)
    poller = threading.Thread(target=watcher.run, daemon=True)
    try:
        assert http_get(watcher.port, "/readyz")[0] == 503  # the processor is not built yet
        assert http_get(watcher.port, "/healthz")[0] == 200  # but it is alive
        poller.start()
        with running_daemon(settings, service) as daemon:
            processor = daemon.processor
            wait_all_committed(daemon, settings, rows=120 * 30)
            # The gauges follow at the end of the loop's turn, after the commit.
            wait_for(lambda: settled(scrape(watcher.port)), timeout_s=10,
                     what="no open window, ready and no lag in /metrics")
            running = scrape(watcher.port)
        samples = scrape(watcher.port)  # stopped: the counters move no more
        counters = processor.counters
    finally:
        watcher.stop.set()
        poller.join(5)
        service.close()

    assert slow.assigned_at is not None
    before = [status for at, status in watcher.readyz if at < slow.assigned_at]
    after = [status for at, status in watcher.readyz if at > slow.assigned_at]
    assert before, "no /readyz answer was seen before the assignment"
    assert set(before) == {503}
    assert 200 in after
    assert max(watcher.lags) > 0, f"no backlog was ever reported: {watcher.lags}"

    assert total(samples, "arrowagg_rows_consumed_total") == 120 * 30 == counters.rows
    assert total(samples, "arrowagg_messages_consumed_total", partition="0") == 60
    assert total(samples, "arrowagg_messages_consumed_total", partition="1") == 60
    rejected = total(samples, "arrowagg_rejected_messages_total")
    assert rejected == len(POISON) == counters.rejected
    for reason, count in counters.rejected_by_reason.items():
        assert total(samples, "arrowagg_rejected_messages_total", reason=reason) == count
    emitted = total(samples, "arrowagg_windows_emitted_total")
    assert emitted == counters.windows_emitted >= 3  # 3 s of event time, 1 s windows
    assert total(samples, "arrowagg_emit_latency_seconds_count") == emitted
    assert total(samples, "arrowagg_transaction_commits_total") == counters.commits
    assert total(samples, "arrowagg_transaction_aborts_total") == counters.aborts == 0
    # A partition idle for idle_timeout_ms stops holding the watermark back, so the slow
    # daemon may call some rows late; the metric agrees with the processor either way.
    assert total(samples, "arrowagg_late_rows_total") == counters.late_rows
    assert total(running, "arrowagg_assigned_partitions") == 2
    assert total(samples, "arrowagg_assigned_partitions") == 0  # closing revokes them
