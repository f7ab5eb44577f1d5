"""What the run loop drives, one poll at a time, and what it gets back.

``PollPipeline`` is the interface of a pipeline to the run loop
(consumer/kafka/processor.py): ``Pipeline`` (consumer/core/pipeline.py) on one instance,
or both stages of the scale-out (consumer/core/scale_out/pipeline.py). ``Processed`` says what a
``process`` call took in, ``Flush`` what the run loop must produce, commit, pause and
resume at a turn's end, ``Counters`` what a pipeline has done so far, and
``TurnSnapshot`` where the run loop stood at the end of a turn.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from consumer.core.offsets import CommitMetadata, CommitPoint
from consumer.core.types import ClosedWindow, InputMessage, OutputRecord, PartitionKey


@dataclass
class Counters:
    messages: int = 0
    rows: int = 0  # rows the engine has taken (in a window, or found late); replays count again
    rejected: int = 0
    windows_emitted: int = 0  # in committed transactions
    late_rows: int = 0
    rejected_rows: int = 0  # rows taken out of valid messages (future event times)
    commits: int = 0
    aborts: int = 0
    rejected_by_reason: dict[str, int] = field(default_factory=dict)

    def copy(self) -> Counters:
        return replace(self, rejected_by_reason=dict(self.rejected_by_reason))


@dataclass(frozen=True)
class Consumed:
    """One message's rows taken into the engine."""

    partition: PartitionKey
    rows: int
    nbytes: int


@dataclass(frozen=True)
class Processed:
    """What one ``process`` call did, for the run loop to report."""

    consumed: list[Consumed] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)  # reason codes, one per message
    late_rows: int = 0
    rejected_rows: dict[str, int] = field(default_factory=dict)  # rows taken out, by reason


@dataclass(frozen=True)
class Flush:
    """What the run loop must do at this turn's end: pause/resume partitions for the
    memory budget, and, when ``commit`` is set, produce ``records`` and commit
    ``offsets`` in one transaction."""

    commit: bool
    records: list[OutputRecord]
    offsets: dict[PartitionKey, CommitPoint]
    windows: list[ClosedWindow]
    pause: list[PartitionKey] = field(default_factory=list)
    resume: list[PartitionKey] = field(default_factory=list)


class PollPipeline(Protocol):
    """What the run loop drives: ``Pipeline``, or both stages of the scale-out
    (consumer/core/scale_out/pipeline.py)."""

    counters: Counters

    def assign(self, partition: PartitionKey, committed: int | None,
               metadata: CommitMetadata | None, now_ms: int) -> None: ...
    def revoke(self, partition: PartitionKey) -> None: ...
    def restart(self, committed: Mapping[PartitionKey, tuple[int | None, CommitMetadata | None]],
                now_ms: int) -> tuple[dict[PartitionKey, int | None], list[PartitionKey]]: ...
    def keep_alive(self, partitions: Iterable[PartitionKey], now_ms: int) -> None: ...
    def process(self, messages: Sequence[InputMessage], now_ms: int) -> Processed: ...
    def flush(self, now_ms: int, *, force: bool = False) -> Flush: ...
    def committed(self, flush: Flush, now_ms: int) -> None: ...
    def assigned(self) -> dict[PartitionKey, int | None]: ...
    def replaying(self) -> bool: ...
    def open_windows(self) -> int: ...
    def groups(self) -> int: ...
    def pending_records(self) -> int: ...
    def paused(self) -> int: ...
    def waiting_windows(self) -> int: ...
    def holding_back(self) -> list[PartitionKey]: ...


@dataclass(frozen=True)
class TurnSnapshot:
    """Where the daemon stood at the end of a turn of its loop: one consistent view.

    Another thread (a test, the bench) must read this, not the processor's attributes:
    mid-turn, rows can be counted but not yet in a window, or a window closed but its
    output not yet committed, and a condition over several attributes can hold for a
    moment that means nothing.
    """

    turns: int
    counters: Counters
    open_windows: int
    pending_output: int  # records built, not yet committed
    ready: bool

    @property
    def settled(self) -> bool:
        """Nothing open and nothing waiting for a commit: all taken input is in output."""
        return self.open_windows == 0 and self.pending_output == 0
