"""Prometheus metrics fed through the observer hooks, read back over HTTP."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import polars as pl
import pytest
from prometheus_client import REGISTRY

from consumer.core.types import ClosedWindow
from consumer.service.health import HealthServer
from consumer.service.metrics import Metrics, consumer_lag
from tests.consumer.service.probes import scrape, total

IN = "sensors"


def window(start_ms: int) -> ClosedWindow:
    return ClosedWindow(start_ms, start_ms + 1000, pl.DataFrame({"row_count": [1]}), 1)


def partition(number: int, **fields: int) -> dict[str, Any]:
    base = {"partition": number, "consumer_lag": -1, "app_offset": -1001,
            "ls_offset": -1001, "hi_offset": -1001, "committed_offset": -1001}
    return {**base, **fields}


def stats(*partitions: dict[str, Any], topic: str = IN) -> str:
    """librdkafka's statistics JSON, reduced to the fields the lag is read from."""
    return json.dumps({"name": "rdkafka#consumer-1", "type": "consumer", "topics": {
        topic: {"topic": topic, "partitions": {str(p["partition"]): p for p in partitions}}}})


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def port(metrics: Metrics) -> Iterator[int]:
    server = HealthServer("127.0.0.1", 0, metrics=metrics.exposition, liveness_timeout_s=60)
    yield server.port
    server.close()


def test_consumption_is_counted_per_partition(metrics: Metrics, port: int) -> None:
    metrics.consumed((IN, 0), 1, 100, 2048)
    metrics.consumed((IN, 0), 1, 50, 1024)
    metrics.consumed((IN, 1), 1, 7, 10)
    samples = scrape(port)
    assert total(samples, "arrowagg_messages_consumed_total", partition="0") == 2
    assert total(samples, "arrowagg_rows_consumed_total", topic=IN, partition="0") == 150
    assert total(samples, "arrowagg_bytes_consumed_total", partition="0") == 3072
    assert total(samples, "arrowagg_rows_consumed_total") == 157


def test_windows_latency_commits_and_state(metrics: Metrics, port: int) -> None:
    metrics.state(open_windows=4, groups=120, ready=True)
    metrics.committed([window(0), window(1000)], closed_at_ms=10_000, committed_at_ms=10_040)
    metrics.committed([], closed_at_ms=11_000, committed_at_ms=11_001)  # an interval commit
    metrics.committed([window(2000)], closed_at_ms=12_000, committed_at_ms=14_000)
    metrics.aborted()
    metrics.rebalanced()
    samples = scrape(port)
    assert total(samples, "arrowagg_windows_emitted_total") == 3
    assert total(samples, "arrowagg_transaction_commits_total") == 3
    assert total(samples, "arrowagg_transaction_aborts_total") == 1
    assert total(samples, "arrowagg_rebalances_total") == 1
    assert total(samples, "arrowagg_windows_open") == 4
    assert total(samples, "arrowagg_state_groups") == 120
    assert total(samples, "arrowagg_ready") == 1
    assert total(samples, "arrowagg_emit_latency_seconds_count") == 3
    assert total(samples, "arrowagg_emit_latency_seconds_sum") == pytest.approx(0.04 * 2 + 2)
    assert total(samples, "arrowagg_emit_latency_seconds_bucket", le="0.05") == 2
    assert total(samples, "arrowagg_emit_latency_seconds_bucket", le="2.5") == 3
    assert metrics.summary() == "windows emitted 3, lag 0, groups 120"


def test_rejections_by_reason_and_late_rows(metrics: Metrics, port: int) -> None:
    for reason in ("not-arrow", "not-arrow", "too-large"):
        metrics.rejected(reason)
    metrics.late(7)
    metrics.late(3)
    samples = scrape(port)
    assert total(samples, "arrowagg_rejected_messages_total", reason="not-arrow") == 2
    assert total(samples, "arrowagg_rejected_messages_total", reason="too-large") == 1
    assert total(samples, "arrowagg_late_rows_total") == 10


def test_rejected_rows_by_reason(metrics: Metrics, port: int) -> None:
    metrics.rejected_rows("future-event-time", 3)
    metrics.rejected_rows("future-event-time", 2)
    assert total(scrape(port), "arrowagg_rejected_rows_total",
                 reason="future-event-time") == 5


def test_windows_waiting_for_completeness_and_the_partitions_they_wait_for(
        metrics: Metrics, port: int) -> None:
    metrics.completeness(4, [(IN, 0), (IN, 3)])
    samples = scrape(port)
    assert total(samples, "arrowagg_windows_waiting") == 4
    assert total(samples, "arrowagg_holding_back", partition="0") == 1
    assert total(samples, "arrowagg_holding_back", partition="3") == 1
    metrics.completeness(1, [(IN, 3)])  # partition 0 caught up
    samples = scrape(port)
    assert total(samples, "arrowagg_windows_waiting") == 1
    assert ("arrowagg_holding_back", frozenset({("topic", IN), ("partition", "0")})) \
        not in samples
    metrics.completeness(0, [])
    assert total(scrape(port), "arrowagg_holding_back") == 0


def test_lag_of_assigned_partitions_from_statistics(metrics: Metrics, port: int) -> None:
    metrics.assigned([(IN, 0), (IN, 1), (IN, 2)])
    metrics.statistics(stats(
        partition(0, ls_offset=500, hi_offset=520, app_offset=380),  # position known
        partition(1, consumer_lag=7, ls_offset=50),   # nothing consumed since assignment
        partition(2),                                 # nothing known yet
        partition(3, ls_offset=90, app_offset=10),    # not ours
        partition(-1, consumer_lag=5),                # librdkafka's internal partition
    ))
    samples = scrape(port)
    assert total(samples, "arrowagg_consumer_lag", partition="0") == 120
    assert total(samples, "arrowagg_consumer_lag", partition="1") == 7
    assert ("arrowagg_consumer_lag", frozenset({("topic", IN), ("partition", "2")})) \
        not in samples
    assert total(samples, "arrowagg_consumer_lag") == 127
    assert total(samples, "arrowagg_assigned_partitions") == 3
    assert metrics.summary().startswith("windows emitted 0, lag 127,")
    metrics.revoked([(IN, 0)])  # its new owner reports its lag now
    samples = scrape(port)
    assert total(samples, "arrowagg_consumer_lag") == 7
    assert total(samples, "arrowagg_assigned_partitions") == 2


def test_lag_parsing_edge_cases() -> None:
    assert consumer_lag("not json") == {}
    assert consumer_lag(json.dumps({"topics": {}})) == {}
    caught_up = stats(partition(0, ls_offset=40, app_offset=40, consumer_lag=40))
    assert consumer_lag(caught_up) == {(IN, 0): 0}  # the stale committed lag is ignored
    uncommitted = stats(partition(0, ls_offset=40, hi_offset=45, app_offset=40))
    assert consumer_lag(uncommitted, read_committed=False) == {(IN, 0): 5}
    assert consumer_lag(uncommitted, read_committed=True) == {(IN, 0): 0}


def test_each_instance_has_its_own_registry(port: int) -> None:
    a, b = Metrics(), Metrics()
    a.late(5)
    assert b.registry is not a.registry
    assert b"arrowagg_late_rows_total 0.0" in b.exposition()
    assert REGISTRY.get_sample_value("arrowagg_late_rows_total") is None
    assert total(scrape(port), "arrowagg_late_rows_total") == 0
