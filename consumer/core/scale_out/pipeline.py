"""Both stages of the scale-out in one process, behind the run loop's pipeline interface.

Every instance runs both (as Kafka Streams runs all its sub-topologies in every
instance): messages of the input topics go to stage 1 (``Pipeline`` with a partial-state
emitter, consumer/core/scale_out/stage_one.py), messages of the repartition topic to stage 2
(consumer/core/scale_out/stage_two.py). One flush is one transaction holding both stages' records
and offsets; users scale by starting more identical instances.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from consumer.core.emit import emitted_lines
from consumer.core.offsets import CommitMetadata
from consumer.core.pipeline import Pipeline
from consumer.core.poll import Counters, Flush, Processed
from consumer.core.scale_out.stage_two import StageTwo
from consumer.core.types import InputMessage, PartitionKey

log = logging.getLogger(__name__)


class TwoStagePipeline:
    def __init__(self, stage_one: Pipeline, stage_two: StageTwo, repartition_topic: str, *,
                 commit_interval_ms: int) -> None:
        self._one = stage_one
        self._two = stage_two
        self._topic = repartition_topic
        self.counters: Counters = stage_one.counters
        self._last: tuple[Flush, int] | None = None
        self._committed_two: dict[PartitionKey, int] = {}
        self._commit_interval_ms = commit_interval_ms
        self._last_commit_ms: int | None = None

    def _is_two(self, partition: PartitionKey) -> bool:
        return partition[0] == self._topic

    # -- partitions ----------------------------------------------------------------------

    def assign(self, partition: PartitionKey, committed: int | None,
               metadata: CommitMetadata | None, now_ms: int) -> None:
        if self._is_two(partition):
            self._two.assign(partition, committed, metadata)
        else:
            self._one.assign(partition, committed, metadata, now_ms)

    def revoke(self, partition: PartitionKey) -> None:
        if self._is_two(partition):
            self._two.revoke(partition)
        else:
            self._one.revoke(partition)

    def restart(self, committed: Mapping[PartitionKey, tuple[int | None, CommitMetadata | None]],
                now_ms: int) -> tuple[dict[PartitionKey, int | None], list[PartitionKey]]:
        ones = {p: c for p, c in committed.items() if not self._is_two(p)}
        twos = {p: c for p, c in committed.items() if self._is_two(p)}
        targets, released = self._one.restart(ones, now_ms)
        return {**targets, **self._two.restart(twos)}, released

    def keep_alive(self, partitions: Iterable[PartitionKey], now_ms: int) -> None:
        self._one.keep_alive([p for p in partitions if not self._is_two(p)], now_ms)

    # -- one turn ------------------------------------------------------------------------

    def process(self, messages: Sequence[InputMessage], now_ms: int) -> Processed:
        ones = [m for m in messages if not self._is_two(m.partition)]
        twos = [m for m in messages if self._is_two(m.partition)]
        done = self._one.process(ones, now_ms) if ones else Processed()
        if twos:
            self._two.process(twos)
        return done

    def flush(self, now_ms: int, *, force: bool = False) -> Flush:
        one = self._one.flush(now_ms, force=force)
        records, offsets, windows = self._two.flush(now_ms)
        self._last = (one, len(records))
        # Stage 2's offsets move with progress records that emit nothing: commit them at
        # the commit interval too, or an instance with no input partition never would.
        moved = {p: point.offset for p, point in offsets.items()} != self._committed_two
        last = self._last_commit_ms if self._last_commit_ms is not None else now_ms
        interval_due = now_ms - last >= self._commit_interval_ms
        self._last_commit_ms = last
        commit = one.commit or bool(records) or (moved and (interval_due or force))
        # Stage 1's closed windows are partial states, not output: the run loop reports
        # (and the metrics count) the windows stage 2 completed.
        return Flush(commit, [*one.records, *records], {**one.offsets, **offsets}, windows,
                     one.pause, one.resume)

    def committed(self, flush: Flush, now_ms: int) -> None:
        assert self._last is not None  # noqa: S101 - a flush comes first
        one, records = self._last
        for line in emitted_lines(one.windows, verb="stage 1 sent partials of"):
            log.info("%s", line)
        self._one.committed(replace(one, windows=[]), now_ms)
        self._two.committed(records)
        self.counters.windows_emitted += len(flush.windows)
        self._committed_two = {p: point.offset for p, point in flush.offsets.items()
                               if self._is_two(p)}
        self._last_commit_ms = now_ms

    # -- state ---------------------------------------------------------------------------

    def assigned(self) -> dict[PartitionKey, int | None]:
        return {**self._one.assigned(), **dict.fromkeys(self._two.assigned())}

    def replaying(self) -> bool:
        return self._one.replaying() or self._two.replaying()

    def open_windows(self) -> int:
        return self._one.open_windows() + self._two.waiting()

    def groups(self) -> int:
        return self._one.groups() + self._two.groups()

    def pending_records(self) -> int:
        return self._one.pending_records() + self._two.pending_records()

    def paused(self) -> int:
        return self._one.paused()

    def waiting_windows(self) -> int:
        """Windows stage 2 holds for completeness, and the input partitions they wait on."""
        return self._two.waiting()

    def holding_back(self) -> list[PartitionKey]:
        return self._two.holding_back()
