"""Event-time progress: per-partition watermarks and the daemon's watermark over them.

A partition's watermark is the largest event time it has delivered minus the allowed
lateness. The daemon's watermark is the minimum over its assigned partitions, so a slow
partition holds windows open rather than turning its rows late. A partition that has
delivered nothing for ``idle_timeout_ms`` (since its last message, or since it was
assigned) stops holding the watermark back: a window must never wait for data that is
not coming.

Idleness is measured on a clock, so two partitions resuming together after a pause race:
the first to be fetched would close windows alone. A partition that resumes while every
other one is quiet (idle, or not resumed since it was assigned) gives them all their idle
timeout again. A replay (input read before, by a previous owner or before a rewind) moves
a partition's progress but is no resumption: taking a partition over mid-pause must not
spend the others' timeout on catching up.
"""

from __future__ import annotations

from dataclasses import dataclass

from consumer.core.types import PartitionKey


@dataclass
class _PartitionActivity:
    max_event_ms: int | None
    last_active_ms: int
    resumed: bool = False  # new input (not a replay) since it was assigned


@dataclass(frozen=True)
class Watermark:
    """``value_ms`` is None while some live partition has not delivered data yet."""

    value_ms: int | None
    all_idle: bool


class WatermarkTracker:
    def __init__(self, *, allowed_lateness_ms: int, idle_timeout_ms: int) -> None:
        self._lateness_ms = allowed_lateness_ms
        self._idle_timeout_ms = idle_timeout_ms
        self._partitions: dict[PartitionKey, _PartitionActivity] = {}

    def assign(self, partition: PartitionKey, now_ms: int, max_event_ms: int | None) -> None:
        """Start tracking ``partition``; ``max_event_ms`` restores progress after a restart."""
        self._partitions[partition] = _PartitionActivity(max_event_ms, now_ms)

    def revoke(self, partition: PartitionKey) -> None:
        self._partitions.pop(partition, None)

    def observe(self, partition: PartitionKey, max_event_ms: int | None, now_ms: int, *,
                replayed: bool = False) -> None:
        """Record a message from ``partition`` whose largest event time is ``max_event_ms``;
        ``replayed``: it was read before, so it is progress but not the stream resuming.

        When every partition was quiet, the stream is resuming after a pause: every
        partition gets its idle timeout again. Otherwise the first to deliver would move
        the watermark alone and close windows whose rows the others are about to bring
        (seen as a whole chunk of in-order rows turned late when two partitions resumed
        together and one was fetched a poll before the other, and when a partition taken
        over mid-pause was replayed and then resumed before the other one).
        """
        progress = self._partitions.setdefault(partition, _PartitionActivity(None, now_ms))
        if not replayed:
            self._resume_if_quiet(now_ms)
            progress.resumed = True
        progress.last_active_ms = now_ms
        if max_event_ms is not None and (
            progress.max_event_ms is None or max_event_ms > progress.max_event_ms
        ):
            progress.max_event_ms = max_event_ms

    def keep_alive(self, partition: PartitionKey, now_ms: int) -> None:
        """``partition`` has input waiting on the broker: it is behind, not idle.

        A backlog found while every partition is idle resumes the stream as a message
        would. One on a partition not resumed yet does not count that partition as
        quiet: a partition held back (paused, or replaying) would otherwise keep the
        idle ones holding the watermark for as long as it waits.
        """
        if all(self._timed_out(p, now_ms) for p in self._partitions.values()):
            self._resume_all(now_ms)
        progress = self._partitions.setdefault(partition, _PartitionActivity(None, now_ms))
        progress.last_active_ms = now_ms

    def _resume_if_quiet(self, now_ms: int) -> None:
        if all(not p.resumed or self._timed_out(p, now_ms) for p in self._partitions.values()):
            self._resume_all(now_ms)

    def _resume_all(self, now_ms: int) -> None:
        for progress in self._partitions.values():
            progress.last_active_ms = now_ms

    def _timed_out(self, progress: _PartitionActivity, now_ms: int) -> bool:
        return now_ms - progress.last_active_ms >= self._idle_timeout_ms

    def idle(self, partition: PartitionKey, now_ms: int) -> bool:
        """True when ``partition`` has delivered nothing (and had no backlog) for the idle
        timeout; an unknown partition is idle."""
        progress = self._partitions.get(partition)
        return progress is None or self._timed_out(progress, now_ms)

    def max_event_ms(self, partition: PartitionKey) -> int | None:
        progress = self._partitions.get(partition)
        return None if progress is None else progress.max_event_ms

    def ahead(self, now_ms: int) -> list[PartitionKey]:
        """Live partitions past the slowest one: they do not hold the watermark back."""
        live = {key: p.max_event_ms for key, p in self._partitions.items()
                if not self._timed_out(p, now_ms)}
        if len(live) < 2:
            return []
        known = [ms for ms in live.values() if ms is not None]
        if not known:
            return []
        slowest = min(known) if len(known) == len(live) else None
        return sorted(key for key, ms in live.items()
                      if ms is not None and (slowest is None or ms > slowest))

    def current(self, now_ms: int) -> Watermark:
        live = [p for p in self._partitions.values() if not self._timed_out(p, now_ms)]
        if not live:
            return Watermark(value_ms=None, all_idle=True)
        if any(p.max_event_ms is None for p in live):
            return Watermark(value_ms=None, all_idle=False)
        lowest = min(p.max_event_ms for p in live if p.max_event_ms is not None)
        return Watermark(value_ms=lowest - self._lateness_ms, all_idle=False)
