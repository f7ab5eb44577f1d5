"""bench.read_ahead: polls handed over in order, errors raised where they are read, the
reading thread stopped and joined when the caller stops early."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import closing

import pytest

from bench.read_ahead import read_ahead


def test_every_poll_arrives_in_order_from_another_thread() -> None:
    readers: set[str] = set()

    def polls() -> Iterator[int]:
        for n in range(10):
            readers.add(threading.current_thread().name)
            yield n

    assert list(read_ahead(polls(), name="test-reader")) == list(range(10))
    assert readers == {"test-reader"}


def test_a_reading_error_follows_the_polls_read_before_it() -> None:
    def polls() -> Iterator[int]:
        yield 1
        yield 2
        raise OSError("the broker went away")

    ahead = read_ahead(polls())
    assert [next(ahead), next(ahead)] == [1, 2]
    with pytest.raises(OSError, match="went away"):
        next(ahead)


def test_stopping_early_stops_and_joins_the_reader() -> None:
    read: list[int] = []

    def polls() -> Iterator[int]:
        for n in range(1_000):
            read.append(n)
            yield n

    before = threading.active_count()
    with closing(read_ahead(polls(), depth=2, name="test-early")) as ahead:
        assert next(ahead) == 0
    assert threading.active_count() == before
    assert len(read) < 10  # at most depth polls ahead, and the one being read
