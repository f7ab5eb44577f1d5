"""Session windows with window.late: revise: a late row within revision_lateness_ms
extends an emitted session or bridges two, and the next revision replaces them; a
subscriber applying every committed revision holds DuckDB's sessions over every row not
sent late, whatever the order of the rows and wherever the daemon crashes."""

from __future__ import annotations

import polars as pl
from hypothesis import example, given
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from consumer.core.plan import AggregationPlan
from consumer.core.types import ClosedWindow, PartitionKey
from tests.consumer.core.windows.helpers import EVENT_PLAN, P0, P1, Row, frame
from tests.consumer.core.windows.session.harness import (
    HOLISTIC_PLAN,
    HOLISTIC_SQL,
    Message,
    MiniDaemon,
    Output,
    committable,
    feed,
    held_sessions,
    not_late,
    session_engine,
    session_reference,
    table_sessions,
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
        steps: list[tuple[list[PartitionKey], str]], gap_ms: int, within_ms: int,
        plan: AggregationPlan = EVENT_PLAN) -> Output:
    daemon = MiniDaemon(partitions, gap_ms=gap_ms, revise_within_ms=within_ms, plan=plan)
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


@given(rows0=st.lists(rows_st, max_size=14), rows1=st.lists(rows_st, max_size=14),
       sizes=st.lists(st.integers(1, 4), min_size=6, max_size=6),
       steps=st.lists(st.tuples(st.lists(st.sampled_from([P0, P1]), min_size=1, max_size=3),
                                st.sampled_from(actions)), max_size=14),
       gap_ms=gaps, within_ms=withins)
def test_revisions_of_buffered_aggregates_hold_duckdbs_over_all_of_a_sessions_rows(
    *, rows0: list[Row], rows1: list[Row], sizes: list[int],
    steps: list[tuple[list[PartitionKey], str]], gap_ms: int, within_ms: int,
) -> None:
    output = run({P0: cut(rows0, sizes), P1: cut(rows1, sizes[::-1])}, steps, gap_ms,
                 within_ms, HOLISTIC_PLAN)
    kept = not_late([*rows0, *rows1], output.late)
    assert_frame_equal(held_sessions(output.windows, HOLISTIC_SQL),
                       session_reference(kept, gap_ms, aggregates=HOLISTIC_SQL),
                       check_exact=False, rel_tol=1e-12)


@given(rows0=st.lists(rows_st, max_size=14), rows1=st.lists(rows_st, max_size=14),
       sizes=st.lists(st.integers(1, 4), min_size=6, max_size=6),
       steps=st.lists(st.tuples(st.lists(st.sampled_from([P0, P1]), min_size=1, max_size=3),
                                st.sampled_from([*actions, "flush+early",
                                                 "flush+early+crash"])), max_size=14),
       gap_ms=gaps, within_ms=withins)
# Found by a thorough run: an early revision emptied a session, the daemon crashed, and
# the session its later rows rebuilt was kept for revisions: a late row's update then
# replaced the emitted rows with a state that lacked the early revision's row.
@example(rows0=[("a", 0, 0.0, 0, 0.0)] * 5 + [("a", 50, 0.0, 0, 0.0)],
         rows1=[("a", 0, 0.0, 0, 0.0)] * 4 + [("a", 50, 0.0, 0, 0.0), ("a", 0, 0.0, 0, 0.0)],
         sizes=[1] * 6, steps=[([P0], "flush+early+crash")], gap_ms=50, within_ms=200)
def test_with_early_revisions_and_crashes_subscribers_hold_the_sessions_not_late(
    *, rows0: list[Row], rows1: list[Row], sizes: list[int],
    steps: list[tuple[list[PartitionKey], str]], gap_ms: int, within_ms: int,
) -> None:
    output = run({P0: cut(rows0, sizes), P1: cut(rows1, sizes[::-1])}, steps, gap_ms,
                 within_ms)
    held = held_sessions(output.windows)  # asserts every replaced session was held
    kept = not_late([*rows0, *rows1], output.late)
    assert_frame_equal(per_key(held, pl.col("row_count").sum()), per_key(frame(kept), pl.len()))
    # ... and it holds the sort-and-scan sessions (docs/wire-format.md), as does
    # wire.sessions.SessionTable
    assert_frame_equal(held, session_reference(kept, gap_ms))
    assert_frame_equal(table_sessions(output.windows), session_reference(kept, gap_ms))


def per_key(rows: pl.DataFrame, count: pl.Expr) -> pl.DataFrame:
    return rows.group_by("k").agg(count.cast(pl.Int64).alias("rows"),
                                  pl.col("n_count").sum()).sort("k", nulls_last=True)


# -- one case at a time ------------------------------------------------------------------


def row(k: str, ts: int, v: float = 1.0) -> Row:
    return (k, ts, v, 1, v)


class Scene:
    """One partition's messages through a revising engine, one poll each."""

    def __init__(self, *, gap_ms: int = 100, within_ms: int = 1_000,
                 plan: AggregationPlan = EVENT_PLAN) -> None:
        self.engine = session_engine(gap_ms=gap_ms, revise_within_ms=within_ms, plan=plan)
        self.engine.assign(P0, None, None, now_ms=0)
        self.offset = 0
        self.rows: list[Row] = []
        self.late: list[pl.DataFrame] = []
        self.windows: list[ClosedWindow] = []

    def send(self, *rows: Row) -> list[ClosedWindow]:
        """Add one message; close what is due; return what went out."""
        late = feed(self.engine, P0, self.offset, list(rows), now_ms=1)
        self.offset += 1
        self.rows += rows
        if late is not None:
            self.late.append(late)
        closed = self.engine.close_due(now_ms=1)
        self.windows += closed
        return closed

    def expected(self) -> pl.DataFrame:
        return session_reference(not_late(self.rows, self.late), 100)


def bounds(window: ClosedWindow) -> list[tuple[object, ...]]:
    return window.frame.select(pl.col("window_start", "window_end").dt.epoch("ms"), "k",
                               pl.col("replaces").list.eval(pl.element().dt.epoch("ms"))
                               ).rows()


def test_a_late_row_extending_an_emitted_session_replaces_it_at_once() -> None:
    scene = Scene()
    scene.send(row("a", 0), row("a", 50))
    (first,) = scene.send(row("b", 1_000))  # the watermark closes a's [0, 150)
    (update,) = scene.send(row("a", 120, 4.0))
    assert (first.kind, first.revision, bounds(first)) == ("full", 0, [(0, 150, "a", [])])
    assert (update.kind, update.revision, update.final) == ("update", 1, True)
    assert bounds(update) == [(0, 220, "a", [0])]
    assert_frame_equal(held_sessions(scene.windows), scene.expected().filter(
        pl.col("k") == "a"))


def test_a_late_row_bridging_two_emitted_sessions_replaces_both_numbered_on() -> None:
    scene = Scene()
    scene.send(row("a", 0), row("a", 230))
    scene.send(row("b", 1_000))  # [0, 100) and [230, 330) go out, revision 0
    (extended,) = scene.send(row("a", 50))  # [0, 150), revision 1
    (bridged,) = scene.send(row("a", 140))  # [0, 330): replaces both
    assert (extended.revision, bounds(extended)) == (1, [(0, 150, "a", [0])])
    assert (bridged.kind, bridged.revision) == ("update", 2)
    assert bounds(bridged) == [(0, 330, "a", [0, 230])]
    assert_frame_equal(held_sessions(scene.windows), scene.expected().filter(
        pl.col("k") == "a"))


def test_a_late_row_that_reopens_a_session_replaces_it_when_it_closes() -> None:
    scene = Scene()
    scene.send(row("a", 0))
    assert len(scene.send(row("b", 150))) == 1  # a's [0, 100) out
    assert scene.send(row("a", 90)) == []  # [0, 190) is open again: the watermark is 150
    (reopened,) = scene.send(row("b", 200))  # watermark 200: it closes
    assert (reopened.kind, reopened.revision, bounds(reopened)) == (
        "update", 1, [(0, 190, "a", [0])])


def test_rows_behind_kept_after_are_late_and_forget_the_kept_session_they_are_in() -> None:
    scene = Scene(within_ms=500)
    scene.send(row("a", 450), row("a", 460))
    scene.send(row("b", 1_000))  # a's [450, 560) out; kept-after 500
    assert scene.send(row("a", 480)) == []  # before kept-after, inside the kept session
    assert scene.send(row("a", 540)) == []  # after it, but the session is forgotten
    assert [f.select(pl.col("ts").dt.epoch("ms")).item() for f in scene.late] == [480, 540]
    later = scene.send(row("a", 700), row("b", 1_200))  # a new session, not late
    assert [b for w in later for b in bounds(w) if b[2] == "a"] == [(700, 800, "a", [])]
    assert_frame_equal(held_sessions(scene.windows).filter(pl.col("k") == "a"),
                       scene.expected().filter(pl.col("k") == "a"))


def test_kept_sessions_expire_and_the_commit_offset_moves_past_them() -> None:
    scene = Scene(within_ms=1_000)
    scene.send(row("a", 0))
    scene.send(row("b", 500))  # a's [0, 100) out and kept: its message must stay
    assert committable(scene.engine)[P0].offset == 0
    scene.send(row("b", 1_099))  # the watermark 1099 is less than 1 s past 100
    assert committable(scene.engine)[P0].offset == 0
    scene.send(row("b", 1_100))  # now it is: forgotten
    assert committable(scene.engine)[P0].offset == 1
    assert scene.send(row("a", 50)) == []
    assert len(scene.late) == 1


def test_a_revision_recomputes_buffered_aggregates_from_all_the_sessions_values() -> None:
    scene = Scene(plan=HOLISTIC_PLAN)
    scene.send(row("a", 0, 1.0), row("a", 50, 2.0))
    scene.send(row("b", 1_000))
    (update,) = scene.send(row("a", 120, 9.0))
    expected = session_reference(scene.rows, 100, aggregates=HOLISTIC_SQL)
    assert_frame_equal(update.frame.drop("replaces"), expected.filter(pl.col("k") == "a"))


def test_a_restart_numbers_on_and_still_replaces_what_an_open_session_took_in() -> None:
    messages = [[row("a", 0)], [row("b", 150)], [row("a", 50)], [row("a", 90)],
                [row("b", 200)], [row("b", 400)], [row("a", 60)]]
    daemon = MiniDaemon({P0: messages}, revise_within_ms=1_000)
    for step in range(4):
        daemon.poll([P0])
        daemon.flush()
        if step >= 2:
            daemon.crash()  # after a revision, and after a reopening
    output = daemon.finish()
    revisions = [(w.kind, w.revision, bounds(w)) for w in output.windows
                 if w.frame["k"].to_list() == ["a"]]
    assert revisions == [("full", 0, [(0, 100, "a", [])]), ("update", 1, [(0, 150, "a", [0])]),
                         ("update", 2, [(0, 190, "a", [0])]),
                         ("update", 3, [(0, 190, "a", [0])])]
    assert_frame_equal(held_sessions(output.windows),
                       session_reference([r for m in messages for r in m], 100))


def test_the_memory_budget_forgets_kept_sessions_and_sends_what_open_ones_took_in() -> None:
    scene = Scene()
    scene.send(row("a", 0), row("c", 0))
    scene.send(row("b", 150))  # a's and c's [0, 100) out and kept
    assert scene.send(row("a", 90)) == []  # a reopens: [0, 190) takes in [0, 100)
    early = scene.engine.emit_early(now_ms=1)
    scene.windows += early
    assert sorted((w.kind, w.final, w.revision, b) for w in early for b in bounds(w)) == [
        ("delta", False, 0, (150, 250, "b", [])), ("delta", False, 1, (0, 190, "a", [0]))]
    assert scene.send(row("c", 50)) == []  # c's session is forgotten: late
    assert len(scene.late) == 1
    assert scene.send(row("a", 120)) == []  # joins a's emptied session
    (last,) = scene.send(row("b", 1_000))  # b's emptied session has nothing more to say
    assert (last.kind, last.revision, bounds(last)) == ("delta", 2, [(0, 220, "a", [])])
    assert_frame_equal(per_key(held_sessions(scene.windows), pl.col("row_count").sum()),
                       per_key(frame(not_late(scene.rows, scene.late)).filter(
                           pl.col("ts").dt.epoch("ms") < 1_000), pl.len()))
