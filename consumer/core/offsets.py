"""Which input offsets are safe to commit: those whose rows are all in emitted windows.

Every consumed message is recorded with the largest window end its rows touched. A
partition's commit offset is the first message whose windows are not all emitted yet;
everything before it is done. After a crash the daemon replays from there, so the open
windows are rebuilt from the input itself and nothing is lost.

The commit carries metadata (``CommitMetadata``): the emitted-window frontier and the
position the consumer had reached. On replay, rows of messages before that position whose
windows lie at or below the frontier were already emitted and are skipped, not counted
twice and not mistaken for late rows. Session windows may add a few keys whose sessions
are closed beyond what the frontier tells (``closed``; docs/design.md, "Session windows").
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from consumer.core.types import NO_WINDOW, PartitionKey


@dataclass(frozen=True)
class Retention:
    """With ``window.late: revise``: the emitted windows kept for revisions.

    ``through``: this partition's rows of windows ending at or before it are in no kept
    state (their revisions are over); those of later emitted windows, up to the frontier,
    are, and the commit offset stays at the first message holding such rows, so a replay
    rebuilds the kept state. ``owners``: a fingerprint of the partitions whose rows built
    the kept windows (the assignment when this was committed): only an instance that owns
    exactly those partitions again can rebuild them. ``revisions``: (window start, last
    revision emitted) of the kept windows past revision 0, so numbering survives a restart.
    """

    through: int | None
    owners: str
    revisions: tuple[tuple[int, int], ...] = ()

    def as_json(self) -> dict[str, object]:
        return {"through": self.through, "owners": self.owners,
                "revisions": [list(pair) for pair in self.revisions]}

    @classmethod
    def from_json(cls, data: object) -> Retention | None:
        """None when absent or malformed: then nothing is kept (the safe reading)."""
        if not isinstance(data, dict):
            return None
        try:
            pairs = tuple((int(s), int(n)) for s, n in data.get("revisions", []))
            return cls(_opt_int(data["through"]), str(data["owners"]), pairs)
        except (ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True)
class SessionRetention:
    """Session windows with ``window.late: revise``: what a replay cannot tell from the
    input alone (docs/design.md, "Late-data revisions of sessions").

    ``kept_after``: emitted sessions ending after it were kept for revisions (None: all
    were). ``sessions``: (key hash, session start, last revision) of the kept sessions
    past revision 0, and of the emitted sessions an open one has taken in (its emission
    will replace them), so numbering survives a restart and replacements are said.
    ``emptied_through``: the latest end of an open session an early revision (the memory
    budget) emptied; a restart cannot see which sessions those were, so none starting
    before it is kept for revisions (None: none was emptied)."""

    kept_after: int | None
    sessions: tuple[tuple[int, int, int], ...] = ()
    emptied_through: int | None = None

    def as_json(self) -> dict[str, object]:
        return {"kept_after": self.kept_after,
                "sessions": [list(triple) for triple in self.sessions],
                **({} if self.emptied_through is None
                   else {"emptied_through": self.emptied_through})}

    @classmethod
    def from_json(cls, data: object) -> SessionRetention | None:
        """None when absent or malformed: then nothing was kept (the safe reading)."""
        if not isinstance(data, dict):
            return None
        try:
            triples = tuple((int(h), int(s), int(r)) for h, s, r in data.get("sessions", []))
            return cls(_opt_int(data["kept_after"]), triples,
                       _opt_int(data.get("emptied_through")))
        except (ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True)
class CommitMetadata:
    """Where a partition's commit stands. Session windows only (empty for the others):
    ``closed`` lists (key hash, time) pairs: rows of those keys before that time were
    emitted or sent to the late topic, rows at or after it are in open sessions;
    ``waiting`` is the first offset whose rows were consumed but not yet taken into any
    session (they waited for a replay to end). ``window.late: revise`` only:
    ``retention``, the emitted windows kept for revisions. Stage 2 of the scale-out only:
    ``early``, the windows whose part went out in revisions before it closed and is not
    closed yet: (start, next revision, messages, rows, input rows of the early revisions,
    1 if one of them emptied the part), so that numbering and the end-of-window marker's
    counts survive a restart. Session windows with early results (``window.emit_every_ms``),
    or once an early revision (a delta) went out: ``revisions_through``, the highest
    revision any session took, which a restart numbers on from
    (consumer/core/windows/session/provisional.py)."""

    frontier: int | None
    position: int
    max_event_ms: int | None
    closed: tuple[tuple[int, int], ...] = ()
    waiting: int | None = None
    retention: Retention | None = None
    kept_sessions: SessionRetention | None = None
    early: tuple[tuple[int, ...], ...] = ()
    revisions_through: int | None = None

    def encode(self) -> str:
        data: dict[str, object] = {"v": 1, "frontier": self.frontier, "position": self.position,
                                   "max_event_ms": self.max_event_ms}
        if self.closed:
            data["closed"] = [list(pair) for pair in self.closed]
        if self.waiting is not None:
            data["waiting"] = self.waiting
        if self.retention is not None:
            data["retained"] = self.retention.as_json()
        if self.kept_sessions is not None:
            data["kept_sessions"] = self.kept_sessions.as_json()
        if self.early:
            data["early"] = [list(entry) for entry in self.early]
        if self.revisions_through is not None:
            data["revisions_through"] = self.revisions_through
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | None) -> CommitMetadata | None:
        """Parse committed metadata; None when absent or written by something else."""
        if not text:
            return None
        try:
            data = json.loads(text)
            if data.get("v") != 1:
                return None
            closed = tuple((int(h), int(t)) for h, t in data.get("closed", ()))
            early = tuple(tuple(int(n) for n in entry) for entry in data.get("early", ()))
            return cls(_opt_int(data["frontier"]), int(data["position"]),
                       _opt_int(data["max_event_ms"]), closed, _opt_int(data.get("waiting")),
                       Retention.from_json(data.get("retained")),
                       SessionRetention.from_json(data.get("kept_sessions")), early,
                       _opt_int(data.get("revisions_through")))
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return None


def owners_fingerprint(partitions: Iterable[PartitionKey]) -> str:
    """A short, stable name for a set of partitions (``Retention.owners``)."""
    text = "\n".join(sorted(f"{topic}\t{partition}" for topic, partition in partitions))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _opt_int(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


@dataclass(frozen=True)
class CommitPoint:
    offset: int
    metadata: CommitMetadata


class OffsetTracker:
    """Per-partition queues of (offset, last window end) for messages not yet committable."""

    def __init__(self) -> None:
        self._pending: dict[PartitionKey, deque[tuple[int, int]]] = {}
        self._next: dict[PartitionKey, int | None] = {}  # next offset to consume
        self._reached: dict[PartitionKey, int] = {}  # furthest position ever consumed

    def assign(self, partition: PartitionKey, committed: int | None,
               reached: int | None = None) -> None:
        """``committed`` is the committed offset (None when the group has none yet);
        ``reached`` the position an earlier run had consumed to (from CommitMetadata)."""
        self._pending[partition] = deque()
        self._next[partition] = committed
        self._reached[partition] = max(reached or 0, committed or 0)

    def revoke(self, partition: PartitionKey) -> None:
        self._pending.pop(partition, None)
        self._next.pop(partition, None)
        self._reached.pop(partition, None)

    def record(self, partition: PartitionKey, offset: int, last_window_end: int) -> None:
        """``last_window_end`` is the end of the last window the message's rows went to.

        Within one poll a rejected message is recorded when it is rejected, before the
        valid messages ahead of it, which are recorded when their rows are added: the
        next offset is the furthest recorded, never the last one.
        """
        self._pending.setdefault(partition, deque()).append((offset, last_window_end))
        self._next[partition] = max(offset + 1, self._next.get(partition) or 0)
        self._reached[partition] = max(self._reached.get(partition, 0), offset + 1)

    def commit_point(self, partition: PartitionKey, frontier: int | None,
                     max_event_ms: int | None, *,
                     retention: Retention | None = None) -> CommitPoint | None:
        """The offset to commit for ``partition`` once its rows in windows ending at or
        before ``frontier`` are emitted; None when nothing was consumed or committed.
        With ``retention``, messages are done only once their windows end at or before
        ``retention.through`` (the kept windows' rows are replayed after a restart)."""
        queue = self._pending.get(partition)
        next_offset = self._next.get(partition)
        if queue is None or next_offset is None:
            return None
        through = frontier if retention is None else retention.through
        done_through = NO_WINDOW if through is None else through
        while queue and queue[0][1] <= done_through:
            queue.popleft()
        offset = queue[0][0] if queue else next_offset
        # A replay that commits before it catches up must keep the earlier reach, or
        # a second crash would mistake already-emitted rows for new late ones.
        reached = max(self._reached[partition], next_offset)
        return CommitPoint(offset, CommitMetadata(frontier, reached, max_event_ms,
                                                  retention=retention))

    def unsent(self, partition: PartitionKey, frontier: int | None) -> bool:
        """Some message of ``partition`` has rows in a window ending after ``frontier``:
        rows consumed and not yet in emitted output."""
        through = NO_WINDOW if frontier is None else frontier
        return any(end > through for _, end in self._pending.get(partition, ()))

    def mark_all_done(self) -> None:
        """Every message consumed so far is in emitted output (an early emission)."""
        for queue in self._pending.values():
            queue.clear()

    def next_offset(self, partition: PartitionKey) -> int | None:
        return self._next.get(partition)

    def partitions(self) -> list[PartitionKey]:
        return list(self._next)
