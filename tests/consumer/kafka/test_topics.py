"""`topics create` returns only once the broker lists what it created, so a worker
publishing right after it finds its topic."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from consumer.kafka.topics import _wait_listed


@dataclass
class _Partition:
    leader: int


@dataclass
class _Topic:
    partitions: dict[int, _Partition]


@dataclass
class _Metadata:
    topics: dict[str, _Topic] = field(default_factory=dict)


class LaggingAdmin:
    """A broker that lists new topics some metadata requests after creating them, the
    first time without a leader."""

    def __init__(self, names: list[str], lag: int) -> None:
        self.names, self.lag, self.asked = names, lag, 0

    def list_topics(self, timeout: float) -> _Metadata:
        del timeout
        self.asked += 1
        if self.asked <= self.lag:
            return _Metadata()
        leader = -1 if self.asked == self.lag + 1 else 1
        return _Metadata({n: _Topic({0: _Partition(leader)}) for n in self.names})


def test_created_topics_are_waited_for_until_listed_with_their_leaders() -> None:
    admin: Any = LaggingAdmin(["in", "out"], lag=4)
    _wait_listed(admin, ["in", "out"], timeout_s=10)
    assert admin.asked == 6


def test_nothing_created_asks_nothing() -> None:
    admin: Any = LaggingAdmin([], lag=0)
    _wait_listed(admin, [], timeout_s=10)
    assert admin.asked == 0
