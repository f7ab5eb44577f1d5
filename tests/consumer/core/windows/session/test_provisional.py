"""Early results of session windows (window.emit_every_ms): open sessions that took in
rows go out whole, provisionally (final: false, kind update), and stay open; a subscriber
that lets each row supersede the provisional sessions of its keys starting within its
bounds holds, at every turn, DuckDB's sort-and-scan sessions over the rows consumed so
far; the closing revisions equal DuckDB over every row, numbered after the provisional
ones, across merges, late revisions and crashes."""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl
from hypothesis import example, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from consumer.core.types import ClosedWindow, PartitionKey
from tests.consumer.core.windows.helpers import P0, P1, Row
from tests.consumer.core.windows.session.harness import (
    HOLISTIC_PLAN,
    HOLISTIC_SQL,
    MiniDaemon,
    emitted,
    feed,
    held_sessions,
    not_late,
    session_engine,
    session_reference,
)

FAR = 10**12  # every partition idle: every session closes


def row(k: str, ts: int, v: float = 1.0, n: int = 1) -> Row:
    return (k, ts, v, n, v)


def kinds(windows: Sequence[ClosedWindow]) -> list[tuple[bool, int, str]]:
    return [(w.final, w.revision, w.kind) for w in windows]


def test_open_sessions_go_out_whole_while_they_grow_and_merge_then_close_numbered_on() -> None:
    engine = session_engine(gap_ms=100, lateness_ms=10_000, provisional=True)
    engine.assign(P0, None, None, now_ms=0)
    engine.assign(P1, None, None, now_ms=0)
    consumed: list[Row] = []
    out: list[ClosedWindow] = []
    steps: list[tuple[PartitionKey, list[Row], set[tuple[str, int]]]] = [
        (P0, [row("a", 100), row("a", 150, 2.0), row("b", 120)], {("a", 100), ("b", 120)}),
        (P1, [row("a", 300, 4.0)], {("a", 300)}),  # b unchanged: not told again
        (P0, [row("a", 230, 8.0)], {("a", 100)}),  # bridges a@100 and a@300
        (P1, [row("a", 40, 0.5)], {("a", 40)}),  # a's start moves back
    ]
    for offset, (partition, rows, told) in enumerate(steps):
        feed(engine, partition, offset // 2, rows, now_ms=offset + 1)
        consumed += rows
        assert engine.close_due(offset + 1) == []
        provisional = engine.provisional(offset + 1)
        assert engine.provisional(offset + 1) == []  # nothing changed since
        assert all(not w.final and w.kind == "update" for w in provisional)
        now = session_reference(consumed, 100)
        got = emitted(provisional)
        assert {(k, int(s.timestamp() * 1000)) for k, s in got.select("k", "window_start")
                .rows()} == told
        assert_frame_equal(got, now.join(got.select("k", "window_start"),
                                         on=["k", "window_start"], how="semi"))
        out += provisional
        assert_frame_equal(held_sessions(out), now)
    assert kinds(out) == [(False, 0, "update"), (False, 0, "update"), (False, 1, "update"),
                          (False, 2, "update")]
    assert engine.open_window_count() == 2
    closed = engine.close_due(FAR)
    assert kinds(closed) == [(True, 3, "full"), (True, 1, "full")]  # a, b
    assert_frame_equal(emitted(closed), session_reference(consumed, 100))
    assert_frame_equal(held_sessions(out + closed), session_reference(consumed, 100))


def test_buffered_aggregates_go_out_as_of_now_and_stay_buffered() -> None:
    engine = session_engine(gap_ms=100, lateness_ms=10_000, plan=HOLISTIC_PLAN,
                            provisional=True)
    engine.assign(P0, None, None, now_ms=0)
    first = [row("a", 100, 1.0, 1), row("a", 150, 5.0, 2), row("b", 120, 3.0)]
    second = [row("a", 190, 2.0, 2), row("a", 260, 9.0, 3)]
    feed(engine, P0, 0, first, now_ms=1)
    early = engine.provisional(1)
    assert_frame_equal(emitted(early, HOLISTIC_SQL),
                       session_reference(first, 100, aggregates=HOLISTIC_SQL))
    feed(engine, P0, 1, second, now_ms=2)
    [later] = engine.provisional(2)
    assert_frame_equal(emitted([later], HOLISTIC_SQL), session_reference(
        first + second, 100, aggregates=HOLISTIC_SQL).filter(pl.col("k") == "a"))
    assert engine.buffered_values() == 3 * len(first + second)  # nothing let go
    closed = engine.close_due(FAR)
    assert_frame_equal(emitted(closed, HOLISTIC_SQL),
                       session_reference(first + second, 100, aggregates=HOLISTIC_SQL))


def test_a_session_the_memory_budget_emptied_is_told_by_its_deltas_only() -> None:
    engine = session_engine(gap_ms=100, lateness_ms=10_000, provisional=True)
    engine.assign(P0, None, None, now_ms=0)
    feed(engine, P0, 0, [row("a", 100)], now_ms=1)
    [told] = engine.provisional(1)
    [early] = engine.emit_early(2)
    assert (told.revision, early.revision, early.kind, early.final) == (0, 1, "delta", False)
    feed(engine, P0, 1, [row("a", 150, 2.0)], now_ms=3)
    assert engine.provisional(3) == []  # its state holds part of its rows
    [closed] = engine.close_due(FAR)
    assert kinds([closed]) == [(True, 2, "delta")]
    rows = [row("a", 100), row("a", 150, 2.0)]
    assert_frame_equal(held_sessions([told, early, closed]), session_reference(rows, 100))


def test_with_late_revise_a_provisional_merge_names_the_emitted_session_it_takes_in() -> None:
    engine = session_engine(gap_ms=100, revise_within_ms=10_000, provisional=True)
    engine.assign(P0, None, None, now_ms=0)
    rows = [row("a", 100), row("a", 400, 2.0)]
    feed(engine, P0, 0, rows, now_ms=1)  # the watermark (400) closes a@100
    [closed] = engine.close_due(1)
    [told] = engine.provisional(1)  # a@400, open
    assert (kinds([closed, told])) == [(True, 0, "full"), (False, 0, "update")]
    bridge = [row("a", 190, 4.0), row("a", 280, 8.0), row("a", 350, 16.0)]
    feed(engine, P0, 1, bridge, now_ms=2)  # late: a@100 and a@400 become one, still open
    assert engine.close_due(2) == []
    [merged] = engine.provisional(2)
    everything = rows + bridge
    assert kinds([merged]) == [(False, 1, "update")]
    assert merged.frame.get_column("replaces").to_list() == [[closed.frame.item(0, 0)]]
    assert_frame_equal(emitted([merged]), session_reference(everything, 100))
    assert_frame_equal(held_sessions([closed, told, merged]), session_reference(everything, 100))
    [final] = engine.close_due(FAR)
    assert kinds([final]) == [(True, 2, "update")]
    whole = [w for w in [closed, told, merged, final] if w.final]  # what complete=True takes
    assert_frame_equal(held_sessions(whole), session_reference(everything, 100))


messages_st = st.lists(st.tuples(
    st.sampled_from([P0, P1]),
    st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 2_000)), min_size=1,
             max_size=4)), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(messages=messages_st, crash_at=st.sets(st.integers(0, 12), max_size=3),
       revise=st.booleans())
# a@308 comes after a restart: its own session would end after the frontier (327), but
# it would reopen a@209's, which closed less than a gap before it
@example(messages=[(P0, [("a", 209)]), (P0, [("a", 707)]), *[(P1, [("a", 0)])] * 4,
                   (P1, [("a", 627)]), (P1, [("a", 308)])], crash_at={4}, revise=False)
def test_across_crashes_revisions_never_repeat_and_the_closing_ones_equal_duckdb(
    messages: list[tuple[PartitionKey, list[tuple[str, int]]]], crash_at: set[int],
    revise: bool,
) -> None:
    schedule: dict[PartitionKey, list[list[Row]]] = {P0: [], P1: []}
    for partition, rows in messages:
        schedule[partition].append([row(k, ts, float(ts % 7)) for k, ts in rows])
    daemon = MiniDaemon(schedule, gap_ms=100, lateness_ms=300, provisional=True,
                        revise_within_ms=1_000 if revise else None)
    turn = 0
    while not daemon.done():
        daemon.poll([P0, P1])
        daemon.flush()
        if turn in crash_at:
            daemon.crash()
        turn += 1
    out = daemon.finish()
    told: dict[tuple[str, int], set[int]] = {}  # revisions out so far, by (k, start)
    provisional: list[tuple[str, int, int]] = []  # (k, start, revision) out so far
    for window in out.windows:
        bounds = window.frame.select("k", *(pl.col(c).dt.epoch("ms")
                                            for c in ("window_start", "window_end"))).rows()
        for k, start, end in bounds:
            assert window.revision not in told.setdefault((k, start), set()), (k, start)
            told[(k, start)].add(window.revision)
            if window.final:  # numbered after every provisional session it covers
                assert all(r < window.revision for key, s, r in provisional
                           if key == k and start <= s < end)
            else:
                provisional.append((k, start, window.revision))
    everything = [r for m in schedule.values() for message in m for r in message]
    on_time = not_late(everything, out.late)
    whole = [w for w in out.windows if w.final]
    expected = session_reference(on_time, 100)
    assert_frame_equal(held_sessions(whole), expected)
    assert_frame_equal(held_sessions(out.windows), expected)

