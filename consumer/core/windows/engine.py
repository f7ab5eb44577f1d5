"""The shape every window engine has, and the engine that stands in until the plan is
known.

An engine takes decoded rows with the coordinates of the messages they came from, and
answers which windows are due and which input offsets may be committed. The run loop
never asks whether there is an engine yet: before the first valid message fixes the
plan, ``UnplannedEngine`` keeps the assignments and the rejected messages, commits past
the rejections, and hands all of it over to the real engine when one is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import polars as pl

from consumer.core.offsets import CommitMetadata, CommitPoint
from consumer.core.types import ClosedWindow, MessageRef, PartitionKey


class WindowEngine(Protocol):
    late_rows: int
    skipped_replayed_rows: int

    def assign(self, partition: PartitionKey, committed: int | None,
               metadata: CommitMetadata | None, now_ms: int) -> None: ...
    def skip(self, partition: PartitionKey, offset: int, now_ms: int) -> None: ...
    def keep_alive(self, partition: PartitionKey, now_ms: int) -> None: ...
    def revoke(self, partition: PartitionKey) -> None: ...
    def replaying(self, partition: PartitionKey) -> bool: ...
    def ahead_of_watermark(self, now_ms: int) -> list[PartitionKey]: ...
    def add(self, frame: pl.DataFrame, refs: Sequence[MessageRef],
            now_ms: int) -> pl.DataFrame | None: ...
    def close_due(self, now_ms: int) -> list[ClosedWindow]: ...
    def emit_early(self, now_ms: int) -> list[ClosedWindow]: ...
    def provisional(self, now_ms: int) -> list[ClosedWindow]:
        """Early results (window.emit_every_ms): open windows' changed groups as of now,
        as provisional revisions; the windows stay open."""
    def commit_points(self) -> dict[PartitionKey, CommitPoint] | None:
        """The offsets to commit, by partition; None: no commit may happen now (output
        is held back, see TimeWindowEngine)."""

    def frontiers(self, now_ms: int) -> dict[PartitionKey, tuple[int | None, bool]]:
        """Each assigned partition's emitted frontier, and whether it is idle."""

    def discard(self) -> None: ...
    def cardinality(self) -> int:
        """Groups held in open windows: an upper bound while partial states are pending."""

    def merge_pending(self) -> None:
        """Merge pending partial states, so that ``cardinality`` counts each group once."""

    def buffered_values(self) -> int:
        """Values buffered for aggregates that do not decompose (holistic.py)."""

    def open_window_count(self) -> int: ...


@dataclass
class _HeldPartition:
    committed: int | None
    metadata: CommitMetadata | None
    skipped: list[int]
    last_active_ms: int


class UnplannedEngine:
    """The engine before any message has fixed the plan: it holds no window, and every
    message it hears of was rejected (dead-lettered), so it is done at once."""

    def __init__(self, *, idle_timeout_ms: int | None = None) -> None:
        """``idle_timeout_ms``: a partition it has heard nothing of for this long is idle
        (None: never), which the scale-out's progress reports say."""
        self._idle_timeout_ms = idle_timeout_ms
        self._assigned: dict[PartitionKey, _HeldPartition] = {}
        self.late_rows = 0
        self.skipped_replayed_rows = 0

    def assign(self, partition: PartitionKey, committed: int | None,
               metadata: CommitMetadata | None, now_ms: int) -> None:
        self._assigned[partition] = _HeldPartition(committed, metadata, [], now_ms)

    def revoke(self, partition: PartitionKey) -> None:
        self._assigned.pop(partition, None)

    def skip(self, partition: PartitionKey, offset: int, now_ms: int) -> None:
        if (assignment := self._assigned.get(partition)) is not None:
            assignment.skipped.append(offset)
            assignment.last_active_ms = now_ms

    def commit_points(self) -> dict[PartitionKey, CommitPoint]:
        """Past the rejected messages, keeping the earlier commit's frontier, so a restart
        does not dead-letter them again."""
        points = {}
        for partition, assignment in self._assigned.items():
            if not assignment.skipped:
                continue
            offset = max(assignment.skipped) + 1
            before = assignment.metadata or CommitMetadata(None, 0, None)
            metadata = replace(before, position=max(before.position, offset))
            points[partition] = CommitPoint(offset, metadata)
        return points

    def hand_over(self, engine: WindowEngine, now_ms: int) -> WindowEngine:
        """Tell ``engine`` everything this one was told; return it."""
        for partition, assignment in self._assigned.items():
            engine.assign(partition, assignment.committed, assignment.metadata, now_ms)
            for offset in assignment.skipped:
                engine.skip(partition, offset, now_ms)
        return engine

    def add(self, frame: pl.DataFrame, refs: Sequence[MessageRef],  # noqa: ARG002
            now_ms: int) -> pl.DataFrame | None:  # noqa: ARG002
        raise RuntimeError("rows reached the engine before the plan was fixed")

    def discard(self) -> None:
        for assignment in self._assigned.values():
            assignment.skipped.clear()  # replayed from the committed offset again

    def keep_alive(self, partition: PartitionKey, now_ms: int) -> None:
        if (assignment := self._assigned.get(partition)) is not None:
            assignment.last_active_ms = now_ms

    def frontiers(self, now_ms: int) -> dict[PartitionKey, tuple[int | None, bool]]:
        timeout = self._idle_timeout_ms
        return {partition: (None if a.metadata is None else a.metadata.frontier,
                            timeout is not None and now_ms - a.last_active_ms >= timeout)
                for partition, a in self._assigned.items()}

    def replaying(self, partition: PartitionKey) -> bool:  # noqa: ARG002
        return False

    def ahead_of_watermark(self, now_ms: int) -> list[PartitionKey]:  # noqa: ARG002
        return []

    def close_due(self, now_ms: int) -> list[ClosedWindow]:  # noqa: ARG002
        return []

    def provisional(self, now_ms: int) -> list[ClosedWindow]:  # noqa: ARG002
        return []

    def emit_early(self, now_ms: int) -> list[ClosedWindow]:  # noqa: ARG002
        return []

    def cardinality(self) -> int:
        return 0

    def merge_pending(self) -> None:
        pass

    def buffered_values(self) -> int:
        return 0

    def open_window_count(self) -> int:
        return 0
