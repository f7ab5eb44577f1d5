"""Which input offsets a session engine must not commit past yet.

A session's end is not known until it closes, so messages are not recorded with a window
end (as ``offsets.OffsetTracker`` does for time windows): polls are numbered, a session
remembers the first poll whose rows it holds, and a partition's commit offset is its first
message in the oldest poll still held. Rows consumed but in no session yet (they waited
for a replay to end) are named in the commit metadata as ``waiting``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from consumer.core.types import PartitionKey

Firsts = dict[PartitionKey, int]  # per partition, the first offset of something


class PollOffsets:
    def __init__(self) -> None:
        self._firsts: dict[int, Firsts] = {}  # poll -> each partition's first message
        # Restored (waiting, position): messages between were consumed by an earlier run
        # and never taken into a session.
        self._undecided: dict[PartitionKey, tuple[int, int]] = {}

    def record(self, seq: int, partition: PartitionKey, offset: int) -> None:
        """A message with rows, consumed in poll ``seq``."""
        firsts = self._firsts.setdefault(seq, {})
        firsts[partition] = min(offset, firsts.get(partition, offset))

    def restore(self, partition: PartitionKey, waiting: int | None, position: int) -> None:
        if waiting is not None and waiting < position:
            self._undecided[partition] = (waiting, position)

    def forget(self, partition: PartitionKey) -> None:
        self._undecided.pop(partition, None)

    def held(self, oldest_seq: int | None) -> Firsts:
        """Per partition, its first message in the polls from ``oldest_seq`` on."""
        held: Firsts = {}
        for seq, firsts in self._firsts.items():
            if oldest_seq is not None and seq >= oldest_seq:
                _lower(held, firsts)
        return held

    def waiting(self, untaken: Iterable[Firsts],
                consumed: Callable[[PartitionKey], int | None]) -> Firsts:
        """Per partition, the first message whose rows no session has taken: from
        ``untaken`` (held or unreported rows) and what an earlier run left undecided and
        this one has not consumed again yet (``consumed``: the next offset to read)."""
        first: Firsts = {}
        for firsts in untaken:
            _lower(first, firsts)
        for partition, (since, until) in list(self._undecided.items()):
            reached = consumed(partition)
            if reached is not None and reached >= until:
                del self._undecided[partition]  # read again: each row taken or held since
                continue
            _lower(first, {partition: since if reached is None else max(since, reached)})
        return first

    def prune(self, oldest_seq: int | None) -> None:
        """Forget the polls before ``oldest_seq`` (None: all of them)."""
        self._firsts = {seq: f for seq, f in self._firsts.items()
                        if oldest_seq is not None and seq >= oldest_seq}


def _lower(into: Firsts, firsts: Firsts) -> None:
    for partition, offset in firsts.items():
        into[partition] = min(offset, into.get(partition, offset))
