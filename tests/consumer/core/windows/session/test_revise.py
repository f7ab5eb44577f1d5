"""Session windows with window.late: revise: a late row within revision_lateness_ms
extends an emitted session or bridges two, and the next revision replaces them; a
subscriber applying every committed revision holds DuckDB's sessions over every row not
sent late, whatever the order of the rows and wherever the daemon crashes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from consumer.core.types import PartitionKey
from tests.consumer.core.windows.helpers import P0, P1, Row
from tests.consumer.core.windows.session.harness import (
    Message,
    MiniDaemon,
    Output,
    held_sessions,
    not_late,
    session_reference,
)

rows_st = st.tuples(st.sampled_from(["a", "b", None]), st.integers(0, 3_000),
                    st.integers(-64, 64).map(lambda i: i / 4), st.integers(-100, 100),
                    st.integers(-64, 64).map(lambda i: i / 2))
gaps = st.sampled_from([50, 100, 300])
withins = st.sampled_from([0, 200, 1_000, 5_000])
actions = ["flush", "flush", "crash", "flush+crash"]


def cut(rows: list[Row], sizes: list[int]) -> list[Message]:
    out, start = [], 0
    for size in sizes:
        out.append(rows[start:start + size])
        start += size
    return [m for m in [*out, rows[start:]] if m]


def run(partitions: dict[PartitionKey, list[Message]],
        steps: list[tuple[list[PartitionKey], str]], gap_ms: int, within_ms: int) -> Output:
    daemon = MiniDaemon(partitions, gap_ms=gap_ms, revise_within_ms=within_ms)
    for order, action in steps:
        daemon.poll(order)
        if "flush" in action:
            daemon.flush(early="early" in action)
        if "crash" in action:
            daemon.crash()
    return daemon.finish()


@given(rows0=st.lists(rows_st, max_size=14), rows1=st.lists(rows_st, max_size=14),
       sizes=st.lists(st.integers(1, 4), min_size=6, max_size=6),
       steps=st.lists(st.tuples(st.lists(st.sampled_from([P0, P1]), min_size=1, max_size=3),
                                st.sampled_from(actions)), max_size=14),
       gap_ms=gaps, within_ms=withins)
def test_a_subscriber_applying_every_revision_holds_the_sessions_of_the_rows_not_late(
    *, rows0: list[Row], rows1: list[Row], sizes: list[int],
    steps: list[tuple[list[PartitionKey], str]], gap_ms: int, within_ms: int,
) -> None:
    output = run({P0: cut(rows0, sizes), P1: cut(rows1, sizes[::-1])}, steps, gap_ms,
                 within_ms)
    kept = not_late([*rows0, *rows1], output.late)
    assert_frame_equal(held_sessions(output.windows), session_reference(kept, gap_ms))
