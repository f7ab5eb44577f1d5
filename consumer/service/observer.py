"""What the run loop tells the outside world: metrics, health, systemd notify.

The processor calls these hooks from its own thread; implementations must be quick and
must not raise. ``NullObserver`` is the default.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from consumer.core.types import ClosedWindow, PartitionKey


class ProcessorObserver(Protocol):
    def loop_turned(self, now_ms: int) -> None:
        """Once per turn of the main loop (the watchdog and /healthz key off this)."""

    def assigned(self, partitions: Sequence[PartitionKey]) -> None: ...
    def revoked(self, partitions: Sequence[PartitionKey]) -> None: ...
    def consumed(self, partition: PartitionKey, messages: int, rows: int, nbytes: int) -> None: ...
    def rejected(self, reason: str) -> None: ...
    def rejected_rows(self, reason: str, rows: int) -> None:
        """Rows taken out of an otherwise valid message (e.g. future event times)."""

    def late(self, rows: int) -> None: ...

    def committed(self, windows: Sequence[ClosedWindow], closed_at_ms: int,
                  committed_at_ms: int) -> None:
        """A transaction (or flush + commit) succeeded with these windows in it."""

    def aborted(self) -> None: ...
    def rebalanced(self) -> None: ...

    def state(self, *, open_windows: int, groups: int, ready: bool, paused: int = 0) -> None:
        """After every turn: open windows, groups held, readiness, and the partitions
        paused to keep within the memory budget."""

    def statistics(self, stats_json: str) -> None:
        """librdkafka's statistics JSON (statistics.interval.ms)."""

    def completeness(self, waiting: int, holding_back: Sequence[PartitionKey]) -> None:
        """Scale-out, after every turn: windows stage 2 holds until every input partition
        is past them, and the input partitions they wait for."""


class NullObserver:
    def loop_turned(self, now_ms: int) -> None:
        pass

    def assigned(self, partitions: Sequence[PartitionKey]) -> None:
        pass

    def revoked(self, partitions: Sequence[PartitionKey]) -> None:
        pass

    def consumed(self, partition: PartitionKey, messages: int, rows: int, nbytes: int) -> None:
        pass

    def rejected(self, reason: str) -> None:
        pass

    def rejected_rows(self, reason: str, rows: int) -> None:
        pass

    def late(self, rows: int) -> None:
        pass

    def committed(self, windows: Sequence[ClosedWindow], closed_at_ms: int,
                  committed_at_ms: int) -> None:
        pass

    def aborted(self) -> None:
        pass

    def rebalanced(self) -> None:
        pass

    def state(self, *, open_windows: int, groups: int, ready: bool, paused: int = 0) -> None:
        pass

    def statistics(self, stats_json: str) -> None:
        pass

    def completeness(self, waiting: int, holding_back: Sequence[PartitionKey]) -> None:
        pass
