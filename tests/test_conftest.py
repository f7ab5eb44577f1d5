"""The suite's own fixtures: a topic made by topic_factory is listed by the broker's
metadata before the test gets its name."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests import conftest


@dataclass
class _Partition:
    leader: int


@dataclass
class _Topic:
    partitions: dict[int, _Partition]
    error: object = None


@dataclass
class _Metadata:
    topics: dict[str, _Topic] = field(default_factory=dict)


class LaggingAdmin:
    """Answers as a broker that learns a new topic some metadata requests late."""

    def __init__(self, lag: int) -> None:
        self.lag = lag
        self.asked = 0

    def list_topics(self, topic: str, timeout: float) -> _Metadata:
        del timeout
        self.asked += 1
        if self.asked <= self.lag:
            return _Metadata()
        if self.asked == self.lag + 1:  # listed, a leader not elected yet
            return _Metadata({topic: _Topic({0: _Partition(-1), 1: _Partition(1)})})
        return _Metadata({topic: _Topic({0: _Partition(1), 1: _Partition(1)})})


def test_a_new_topic_is_waited_for_until_listed_with_every_leader() -> None:
    admin: Any = LaggingAdmin(lag=3)
    conftest._wait_until_listed(admin, "t", partitions=2)
    assert admin.asked == 5


def test_a_topic_never_listed_fails_the_test_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(range(0, 1000, 10))
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(time, "sleep", lambda _s: None)
    admin: Any = LaggingAdmin(lag=10_000)
    with pytest.raises(AssertionError, match="topic t was created but is not listed"):
        conftest._wait_until_listed(admin, "t", partitions=2)
