"""The memory budget for window state: what to do when open windows hold too many groups.

Window state grows with the distinct (window, keys) groups of the open windows. In event
time a partition far ahead of the watermark fills windows that cannot close until the
slowest partition catches up, so the state grows with the lead. ``input.max_groups`` is
the hard bound: reached (counted once the pending partial states are merged, as the
pipeline does before it asks), the open windows are emitted as non-final revisions and
start afresh (``emit_early``). ``input.max_buffered_values`` bounds the values held for
aggregates that do not decompose (consumer/core/holistic.py) the same way, and the
larger share of the two decides. With ``over_budget: pause`` (the default) the partitions
ahead of the watermark are paused first, at ``PAUSE_AT`` of the budget, so the slow ones
can catch up and close windows; they resume below ``RESUME_BELOW``. Pure: the run loop
applies the decisions to the consumer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from consumer.core.types import PartitionKey

OverBudget = Literal["pause", "emit_early"]
PAUSE_AT = 0.8
RESUME_BELOW = 0.5


@dataclass(frozen=True)
class BudgetDecision:
    pause: list[PartitionKey] = field(default_factory=list)
    resume: list[PartitionKey] = field(default_factory=list)
    emit_early: bool = False


class GroupBudget:
    def __init__(self, max_groups: int, policy: OverBudget, *,
                 max_values: int | None = None) -> None:
        """``max_values``: the bound on buffered values (None: none)."""
        self._max_groups = max_groups
        self._max_values = max_values
        self._policy = policy
        self.paused: set[PartitionKey] = set()

    @property
    def max_groups(self) -> int:
        return self._max_groups

    def check(self, groups: int, ahead: Iterable[PartitionKey], *,
              values: int = 0) -> BudgetDecision:
        """``groups`` and buffered ``values`` held now; ``ahead``: partitions ahead of the
        watermark."""
        used = self.used(groups, values)
        if used >= 1:
            return BudgetDecision(emit_early=True)
        if self.paused and used < RESUME_BELOW:
            resume = sorted(self.paused)
            self.paused.clear()
            return BudgetDecision(resume=resume)
        if self._policy == "pause" and used >= PAUSE_AT:
            pause = sorted(p for p in ahead if p not in self.paused)
            self.paused.update(pause)
            return BudgetDecision(pause=pause)
        return BudgetDecision()

    def used(self, groups: int, values: int = 0) -> float:
        """The share of the budget in use: the larger of groups and values."""
        share = groups / self._max_groups
        if self._max_values is not None:
            share = max(share, values / self._max_values)
        return share

    def forget(self, partitions: Iterable[PartitionKey]) -> None:
        """Revoked or lost: no longer ours to resume."""
        self.paused.difference_update(partitions)

    def release_all(self) -> list[PartitionKey]:
        """Everything paused, now resumed (the state was discarded)."""
        released = sorted(self.paused)
        self.paused.clear()
        return released
