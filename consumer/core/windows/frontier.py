"""Each assigned partition's emitted frontier, replay and (late: revise) retention, as the
time engine tracks them; and which restored retention stands after a restart."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from consumer.core.offsets import Retention, owners_fingerprint
from consumer.core.types import PartitionKey


@dataclass
class PartitionFrontier:
    """One assigned partition's emitted frontier and what a restart left to replay.

    ``frontier``: every window ending at or before it holds all of this partition's rows
    that belong to it, in committed output; later rows for such a window are late.
    ``replay_until``: offsets below it were consumed before the restart (by this instance
    or the partition's previous owner), and their rows in windows ending at or before
    ``replayed_frontier`` were emitted then: replaying them again is skipped, not late.
    ``restored_max_ms`` (the largest event time seen before the restart) reaches the
    watermark only once the replay is over: before that, the rows between the committed
    offset and ``replay_until`` are still to come, and closing their windows on the
    restored time would emit them twice.

    With late: revise, ``kept_after``: this partition's rows of emitted windows ending
    after it (and at or before the frontier) are in kept state, which late rows revise;
    ``restored``: the committed retention, until the whole assignment is known.
    """

    frontier: int | None
    replay_until: int = -1
    replayed_frontier: int | None = None
    restored_max_ms: int | None = None
    kept_after: int | None = None
    restored: Retention | None = None


def settle_retention(partitions: Mapping[PartitionKey, PartitionFrontier]) -> dict[int, int]:
    """Decide, once the assignment is known, which restored retention stands, and return
    the revision numbers it carries.

    Kept windows hold the rows of the partitions named by ``Retention.owners``: they are
    rebuilt only when all of these partitions are assigned here again, and only one such
    set can be (two instances' kept windows are two parts of a window, not one). Every
    other partition keeps nothing (``kept_after`` at its frontier): its rows of emitted
    windows are another instance's part, or, of a set no longer whole, cannot be rebuilt.
    """
    restored = {p: f.restored for p, f in partitions.items() if f.restored is not None}
    owners = {r.owners for r in restored.values()}
    whole = [o for o in owners
             if owners_fingerprint([p for p, r in restored.items() if r.owners == o]) == o]
    revisions: dict[int, int] = {}
    for frontier in partitions.values():
        retention, frontier.restored = frontier.restored, None
        if retention is not None and len(whole) == 1 and retention.owners == whole[0]:
            frontier.kept_after = retention.through
            for start, revision in retention.revisions:
                revisions[start] = max(revision, revisions.get(start, 0))
    return revisions


class _Replaying(Protocol):
    replay_until: int  # -1: nothing to replay


def read_before_restart(progress: _Replaying | None, offset: int) -> bool:
    """``offset`` was consumed before the restart or takeover (``replay_until``): its
    message is replayed (skipped, or progress only), not new input."""
    return progress is not None and offset < progress.replay_until


def later(a: int | None, b: int | None) -> int | None:
    """The larger of two optional times (None: nothing yet)."""
    if a is None:
        return b
    return a if b is None else max(a, b)
