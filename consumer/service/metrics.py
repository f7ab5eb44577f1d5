"""Prometheus metrics for the daemon, fed by the processor's observer hooks.

Every metric is named ``arrowagg_*`` and lives in the ``Metrics`` instance's own
``CollectorRegistry`` (not the process-global one), so several daemons or tests in one
process never share counters.

Consumer lag comes from librdkafka's statistics JSON (``statistics.interval.ms``). Its
``consumer_lag`` is measured from the consumer's ``committed_offset``, which a
transactional consumer does not keep up to date: offsets are committed by the producer
(``send_offsets_to_transaction``), so ``committed_offset`` stays at what was fetched on
assignment (-1001 for a new group: lag -1 forever; a restarted instance: a lag that never
shrinks). So the lag here is the partition's end (``ls_offset`` under read_committed, else
``hi_offset``) minus the daemon's position (``app_offset``), and ``consumer_lag`` only
until the first message after an assignment, when the position is the committed offset.
Either way it counts the messages the daemon has yet to consume.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from consumer.core.types import ClosedWindow, PartitionKey
from consumer.service.observer import NullObserver

log = logging.getLogger(__name__)

# From a few milliseconds (a quick transaction) to minutes (a broker in trouble).
EMIT_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                          30.0, 60.0, 120.0)
_TP = ("topic", "partition")


def consumer_lag(stats_json: str, *, read_committed: bool = True) -> dict[PartitionKey, int]:
    """Per-partition lag from librdkafka's statistics (see the module's docstring); unknown
    lags and the internal partition -1 are left out."""
    try:
        stats = json.loads(stats_json)
    except ValueError:
        return {}
    lags: dict[PartitionKey, int] = {}
    for topic, entry in (stats.get("topics") or {}).items():
        for partition in (entry.get("partitions") or {}).values():
            number = int(partition.get("partition", -1))
            lag = _partition_lag(partition, "ls_offset" if read_committed else "hi_offset")
            if number >= 0 and lag is not None:
                lags[(topic, number)] = lag
    return lags


def _partition_lag(partition: dict[str, Any], end_field: str) -> int | None:
    end, position = int(partition.get(end_field, -1)), int(partition.get("app_offset", -1))
    if end >= 0 and position >= 0:
        return max(end - position, 0)
    lag = int(partition.get("consumer_lag", -1))
    return lag if lag >= 0 else None


class Metrics(NullObserver):
    """The processor's observer for Prometheus; ``exposition()`` is the /metrics body."""

    def __init__(self, *, read_committed: bool = True) -> None:
        self._read_committed = read_committed
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self.messages = Counter("arrowagg_messages_consumed", "Input messages decoded",
                                _TP, registry=registry)
        self.bytes = Counter("arrowagg_bytes_consumed", "Input message bytes decoded",
                             _TP, registry=registry)
        self.rows = Counter("arrowagg_rows_consumed", "Input rows decoded", _TP,
                            registry=registry)
        self.lag = Gauge("arrowagg_consumer_lag", "Messages not yet consumed: the end of "
                         "the partition minus the daemon's position", _TP, registry=registry)
        self.windows_open = Gauge("arrowagg_windows_open", "Windows open", registry=registry)
        self.windows_emitted = Counter("arrowagg_windows_emitted", "Windows emitted and "
                                       "committed", registry=registry)
        self.emit_latency = Histogram(
            "arrowagg_emit_latency_seconds", "From a window's close to its commit",
            buckets=EMIT_LATENCY_BUCKETS_S, registry=registry)
        self.late_rows = Counter("arrowagg_late_rows", "Rows for windows already emitted",
                                 registry=registry)
        self.rejected_messages = Counter(
            "arrowagg_rejected_messages", "Input messages rejected (sent to the DLQ when "
            "output.dlq_topic is set), by reason", ("reason",), registry=registry)
        self.rejected_rows_total = Counter(
            "arrowagg_rejected_rows", "Rows taken out of otherwise valid messages (sent to "
            "the DLQ when output.dlq_topic is set), by reason", ("reason",), registry=registry)
        self.groups = Gauge("arrowagg_state_groups", "Distinct (window, keys) groups held",
                            registry=registry)
        self.windows_waiting = Gauge(
            "arrowagg_windows_waiting", "Scale-out: windows stage 2 holds until every input "
            "partition is past them", registry=registry)
        self.holding_back = Gauge(
            "arrowagg_holding_back", "Scale-out: 1 for each input partition the waiting "
            "windows wait for", _TP, registry=registry)
        self._holding: set[PartitionKey] = set()
        self.paused_partitions = Gauge(
            "arrowagg_paused_partitions", "Input partitions paused to keep the groups held "
            "within input.max_groups", registry=registry)
        self.commits = Counter("arrowagg_transaction_commits", "Transactions committed "
                               "(at_least_once: flushes committed)", registry=registry)
        self.aborts = Counter("arrowagg_transaction_aborts", "Transactions aborted",
                              registry=registry)
        self.rebalances = Counter("arrowagg_rebalances", "Partitions revoked or lost",
                                  registry=registry)
        self.assigned_partitions = Gauge("arrowagg_assigned_partitions",
                                         "Input partitions assigned", registry=registry)
        self.ready = Gauge("arrowagg_ready", "1 when assigned and not replaying",
                           registry=registry)
        self.last_loop = Gauge("arrowagg_last_loop_timestamp_seconds",
                               "Wall clock of the main loop's last turn", registry=registry)
        self._assigned: set[PartitionKey] = set()
        self._lags: dict[PartitionKey, int] = {}
        self._emitted = 0
        self._groups = 0

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def summary(self) -> str:
        """One short line for systemd's STATUS=."""
        lag = sum(self._lags.values())
        return f"windows emitted {self._emitted}, lag {lag}, groups {self._groups}"

    def loop_turned(self, now_ms: int) -> None:
        self.last_loop.set(now_ms / 1000)

    def assigned(self, partitions: Sequence[PartitionKey]) -> None:
        self._assigned.update(partitions)
        self.assigned_partitions.set(len(self._assigned))

    def revoked(self, partitions: Sequence[PartitionKey]) -> None:
        for key in partitions:
            self._assigned.discard(key)
            if self._lags.pop(key, None) is not None:
                self.lag.remove(key[0], str(key[1]))  # its new owner reports it now
        self.assigned_partitions.set(len(self._assigned))

    def consumed(self, partition: PartitionKey, messages: int, rows: int, nbytes: int) -> None:
        labels = (partition[0], str(partition[1]))
        self.messages.labels(*labels).inc(messages)
        self.rows.labels(*labels).inc(rows)
        self.bytes.labels(*labels).inc(nbytes)

    def rejected(self, reason: str) -> None:
        self.rejected_messages.labels(reason).inc()

    def rejected_rows(self, reason: str, rows: int) -> None:
        self.rejected_rows_total.labels(reason).inc(rows)

    def late(self, rows: int) -> None:
        self.late_rows.inc(rows)

    def committed(self, windows: Sequence[ClosedWindow], closed_at_ms: int,
                  committed_at_ms: int) -> None:
        self.commits.inc()
        if not windows:
            return
        self._emitted += len(windows)
        self.windows_emitted.inc(len(windows))
        latency_s = max(committed_at_ms - closed_at_ms, 0) / 1000
        for _ in windows:
            self.emit_latency.observe(latency_s)

    def aborted(self) -> None:
        self.aborts.inc()

    def rebalanced(self) -> None:
        self.rebalances.inc()

    def state(self, *, open_windows: int, groups: int, ready: bool, paused: int = 0) -> None:
        self._groups = groups
        self.windows_open.set(open_windows)
        self.groups.set(groups)
        self.paused_partitions.set(paused)
        self.ready.set(1 if ready else 0)

    def completeness(self, waiting: int, holding_back: Sequence[PartitionKey]) -> None:
        self.windows_waiting.set(waiting)
        for key in self._holding - set(holding_back):
            self.holding_back.remove(key[0], str(key[1]))
        for key in holding_back:
            self.holding_back.labels(key[0], str(key[1])).set(1)
        self._holding = set(holding_back)

    def statistics(self, stats_json: str) -> None:
        # Only what this instance owns: librdkafka also lists partitions it merely knows.
        lags = {key: lag for key, lag in consumer_lag(
                    stats_json, read_committed=self._read_committed).items()
                if key in self._assigned}
        for key, lag in lags.items():
            self.lag.labels(key[0], str(key[1])).set(lag)
        self._lags.update(lags)
