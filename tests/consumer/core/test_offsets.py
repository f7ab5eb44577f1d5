from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumer.core.offsets import CommitMetadata, CommitPoint, OffsetTracker, SessionRetention
from consumer.core.types import NO_WINDOW
from consumer.core.windows.session.engine import MAX_LISTED_KEYS

P0 = ("events", 0)
P1 = ("events", 1)

optional_ms = st.none() | st.integers(-(2**62), 2**62)


def committed(offsets: OffsetTracker, partition: tuple[str, int], frontier: int | None,
              max_event_ms: int | None = None) -> CommitPoint:
    point = offsets.commit_point(partition, frontier, max_event_ms)
    assert point is not None
    return point


def test_commit_offset_is_the_first_message_not_done() -> None:
    offsets = OffsetTracker()
    offsets.assign(P0, None)
    for offset, window_end in enumerate([1_000, 2_000, 2_000, 3_000, 5_000]):
        offsets.record(P0, offset, window_end)
    assert committed(offsets, P0, None).offset == 0
    assert committed(offsets, P0, 999).offset == 0
    assert committed(offsets, P0, 1_000).offset == 1
    assert committed(offsets, P0, 2_500).offset == 3
    assert committed(offsets, P0, 3_000).offset == 4
    assert committed(offsets, P0, 5_000).offset == 5  # all done: the next position


def test_commit_offset_never_skips_an_open_message() -> None:
    offsets = OffsetTracker()
    offsets.assign(P0, 10)
    offsets.record(P0, 10, 4_000)  # still open when later messages are done
    offsets.record(P0, 11, 1_000)
    offsets.record(P0, 12, NO_WINDOW)
    assert committed(offsets, P0, 2_000).offset == 10
    assert committed(offsets, P0, 4_000).offset == 13


def test_no_window_messages_are_done_at_once() -> None:
    offsets = OffsetTracker()
    offsets.assign(P0, None)
    offsets.record(P0, 0, NO_WINDOW)
    offsets.record(P0, 1, NO_WINDOW)
    assert committed(offsets, P0, None).offset == 2
    offsets.record(P0, 2, 1_000)
    offsets.record(P0, 3, NO_WINDOW)
    assert committed(offsets, P0, None).offset == 2


def test_a_rejection_recorded_before_its_polls_earlier_messages_is_committed_past() -> None:
    # One poll of offsets 10..12 where 12 was rejected: the rejection is recorded when it
    # is rejected, 10 and 11 when their rows are added. Once all is done, the commit is
    # past 12, or a restart would replay it (found by the 20-SIGKILL test: a partition
    # ending in a poison message stayed committed one short of its end).
    offsets = OffsetTracker()
    offsets.assign(P0, 10)
    offsets.record(P0, 12, NO_WINDOW)
    offsets.record(P0, 10, 1_000)
    offsets.record(P0, 11, 2_000)
    assert committed(offsets, P0, 1_000).offset == 11
    assert committed(offsets, P0, 2_000).offset == 13
    assert offsets.next_offset(P0) == 13


def test_frontier_move_backwards_does_not_undo_a_commit() -> None:
    offsets = OffsetTracker()
    offsets.assign(P0, None)
    offsets.record(P0, 0, 1_000)
    offsets.record(P0, 1, 2_000)
    assert committed(offsets, P0, 1_500).offset == 1
    assert committed(offsets, P0, None).offset == 1


def test_partition_without_position_is_left_out() -> None:
    offsets = OffsetTracker()
    offsets.assign(P0, None)  # no commit yet, nothing consumed
    offsets.assign(P1, 42)  # a commit, nothing consumed since
    assert offsets.commit_point(P0, 1_000, None) is None
    assert committed(offsets, P1, 1_000, 9) == CommitPoint(
        42, CommitMetadata(frontier=1_000, position=42, max_event_ms=9))


def test_metadata_carries_the_partitions_frontier_position_and_max_event() -> None:
    offsets = OffsetTracker()
    offsets.assign(P0, 5)
    offsets.assign(P1, None)
    offsets.record(P0, 5, 2_000)
    offsets.record(P0, 6, 3_000)
    offsets.record(P1, 0, 1_000)
    assert committed(offsets, P0, 2_000, 2_600) == CommitPoint(
        6, CommitMetadata(frontier=2_000, position=7, max_event_ms=2_600))
    assert committed(offsets, P1, 1_000, 900) == CommitPoint(
        1, CommitMetadata(frontier=1_000, position=1, max_event_ms=900))


def test_missing_max_event_is_none() -> None:
    offsets = OffsetTracker()
    offsets.record(P0, 3, NO_WINDOW)  # a partition first seen through a message
    assert committed(offsets, P0, None).metadata == CommitMetadata(None, 4, None)


def test_revoke_forgets_the_partition() -> None:
    offsets = OffsetTracker()
    offsets.assign(P0, 1)
    offsets.assign(P1, 2)
    offsets.record(P0, 1, 1_000)
    offsets.revoke(P0)
    assert offsets.partitions() == [P1]
    assert offsets.commit_point(P0, 5_000, None) is None
    assert committed(offsets, P1, 5_000).offset == 2
    offsets.revoke(P0)  # twice is harmless
    assert offsets.partitions() == [P1]


def test_reassign_starts_afresh() -> None:
    offsets = OffsetTracker()
    offsets.assign(P0, None)
    offsets.record(P0, 0, 9_000)
    offsets.assign(P0, 30)
    assert committed(offsets, P0, None).offset == 30


@given(ends=st.lists(st.integers(0, 20) | st.just(NO_WINDOW), max_size=30),
       frontier=st.none() | st.integers(0, 20), first=st.integers(0, 1_000))
def test_commit_offset_matches_a_scan(ends: list[int], frontier: int | None, first: int) -> None:
    offsets = OffsetTracker()
    offsets.assign(P0, first)
    for i, end in enumerate(ends):
        offsets.record(P0, first + i, end)
    done = NO_WINDOW if frontier is None else frontier
    expected = next((first + i for i, end in enumerate(ends) if end > done), first + len(ends))
    assert committed(offsets, P0, frontier).offset == expected


# -- CommitMetadata ----------------------------------------------------------------------


def test_metadata_encoding_is_compact_json() -> None:
    text = CommitMetadata(frontier=10_000, position=7, max_event_ms=None).encode()
    assert " " not in text
    assert json.loads(text) == {"v": 1, "frontier": 10_000, "position": 7, "max_event_ms": None}


@given(frontier=optional_ms, position=st.integers(0, 2**63 - 1), max_event_ms=optional_ms)
def test_metadata_round_trip(frontier: int | None, position: int, max_event_ms: int | None) -> None:
    meta = CommitMetadata(frontier, position, max_event_ms)
    assert CommitMetadata.decode(meta.encode()) == meta


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "not json",
        "{",
        "null",
        "[]",
        "42",
        '"a string"',
        '{"v": 2, "frontier": 1, "position": 2, "max_event_ms": 3}',
        '{"frontier": 1, "position": 2, "max_event_ms": 3}',
        '{"v": 1}',
        '{"v": 1, "frontier": 1, "max_event_ms": 3}',
        '{"v": 1, "frontier": "soon", "position": 2, "max_event_ms": 3}',
        '{"v": 1, "frontier": [1], "position": 2, "max_event_ms": 3}',
        '{"v": 1, "frontier": 1, "position": null, "max_event_ms": 3}',
        "\x00\xff\xfe",
    ],
)
def test_decode_is_tolerant(text: str | None) -> None:
    assert CommitMetadata.decode(text) is None


def test_decode_tolerates_deeply_nested_garbage() -> None:
    # Kafka keeps up to 4096 bytes of commit metadata (offset.metadata.max.bytes), written
    # by whoever commits for the group; nesting that deep must read as "not ours", not crash.
    assert CommitMetadata.decode("[" * 2_000) is None


def test_decode_accepts_missing_optional_values() -> None:
    text = '{"v": 1, "frontier": null, "position": 0, "max_event_ms": null}'
    assert CommitMetadata.decode(text) == CommitMetadata(None, 0, None)


def test_session_fields_round_trip_and_stay_out_of_other_metadata() -> None:
    plain = CommitMetadata(frontier=1_000, position=7, max_event_ms=1_200)
    assert plain.encode() == '{"v":1,"frontier":1000,"position":7,"max_event_ms":1200}'
    sessions = CommitMetadata(frontier=1_000, position=7, max_event_ms=1_200,
                              closed=((2**62 + 5, 950), (17, -(2**63))), waiting=5)
    assert CommitMetadata.decode(sessions.encode()) == sessions
    assert CommitMetadata.decode(plain.encode()) == plain


@given(kept_after=optional_ms,
       triples=st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(-(2**62), 2**62),
                                  st.integers(0, 10**6)), max_size=48))
def test_kept_sessions_round_trip(kept_after: int | None,
                                  triples: list[tuple[int, int, int]]) -> None:
    meta = CommitMetadata(1_000, 7, 1_200, kept_sessions=SessionRetention(
        kept_after, tuple(triples)))
    assert CommitMetadata.decode(meta.encode()) == meta


@pytest.mark.parametrize("kept", ['{"kept_after": "x"}', '{"sessions": []}', "[]",
                                  '{"kept_after": 1, "sessions": [[1, 2]]}'])
def test_malformed_kept_sessions_read_as_nothing_kept(kept: str) -> None:
    text = f'{{"v":1,"frontier":1,"position":2,"max_event_ms":3,"kept_sessions":{kept}}}'
    assert CommitMetadata.decode(text) == CommitMetadata(1, 2, 3)


@pytest.mark.parametrize("listed", [0, 24, 48])
def test_the_largest_session_metadata_fits_kafkas_default_limit(listed: int) -> None:
    # The session engine lists at most MAX_LISTED_KEYS keys and sessions together.
    big = 2**63 - 1
    meta = CommitMetadata(big, big, big, closed=((big, -big),) * listed, waiting=big,
                          kept_sessions=SessionRetention(-big, ((big, -big, big),) * (
                              MAX_LISTED_KEYS - listed)))
    assert len(meta.encode()) <= 4096  # offset.metadata.max.bytes
