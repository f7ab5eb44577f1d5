"""Early results of session windows with the scale-out (window.emit_every_ms): stage 2
sends its open merged sessions that changed, whole, provisional (final: false, kind
update), outside the frontier batches; stage 1 sends its partial sessions that often.

Checked against independent references: the closing sessions a whole-session reader
assembles equal DuckDB's sort-and-scan over the rows not late; a subscriber applying
docs/wire-format.md's supersede rule (a plain loop here, written from that text) ends
with exactly those sessions; a provisional session's row count only grows under its
(keys, start) and never passes the closing session covering its start; numbers go on
across restarts; and stage 2 keeps and commits what it does without early results."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from consumer.core.scale_out.session_runs import SessionRunsEngine
from consumer.core.scale_out.stage_one import PartialEmitter
from consumer.core.types import OutputRecord
from consumer.core.windows.session.spans import SessionSpec
from tests.consumer.core.scale_out.session_world import (
    GAP_MS,
    IDLE_MS,
    INPUTS,
    World,
    late_rows,
    run,
    subscribed,
)
from tests.consumer.core.windows.helpers import EVENT_PLAN, UTC_MS, Row, frame, ref
from tests.consumer.core.windows.session.harness import SORT, session_reference
from wire.output import OutputWindow, decode_message

COLUMNS = ["window_start", "window_end", "k", "v_sum", "n_count", "v_max", "row_count"]
Session = tuple[Any, datetime]  # (k, window_start)


def session_output(records: Sequence[OutputRecord]) -> list[OutputWindow]:
    """The output topic's session messages, in order (markers and late records left out)."""
    out = []
    for record in records:
        if record.topic != "out":
            continue
        message = decode_message(record.value, record.headers)
        if isinstance(message, OutputWindow):
            out.append(message)
    return out


def is_provisional(window: OutputWindow) -> bool:
    return not window.final and window.kind == "update"


def running_view(windows: Sequence[OutputWindow]) -> dict[Session, dict[str, Any]]:
    """What a subscriber holds after applying ``windows`` in order by the rule of
    docs/wire-format.md: a row supersedes every provisional session of its keys whose
    window_start lies within its [window_start, window_end), then is its own session.
    Each row checks on the way that its revision is past those of the rows it replaces."""
    held: dict[Session, dict[str, Any]] = {}
    for window in windows:
        for values in window.frame.to_dicts():
            start, end = values["window_start"], values["window_end"]
            gone = [at for at, h in held.items() if h["provisional"] and at[0] == values["k"]
                    and start <= at[1] < end]
            at = (values["k"], start)
            before = [held[g]["revision"] for g in gone] + (
                [held[at]["revision"]] if at in held else [])
            assert all(window.revision > r for r in before), (at, window.revision, before)
            for g in gone:
                del held[g]
            held[at] = {**values, "provisional": is_provisional(window),
                        "revision": window.revision}
    return held


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("crashes", [False, True], ids=["steady", "crashes"])
def test_provisional_sessions_grow_to_the_closing_ones_of_the_reference(
        seed: int, crashes: bool) -> None:
    world = run(seed, crashes=crashes, emit_every_ms=10)
    rows = [r for log in world.inputs.values() for m in log for r in m]
    left = list(rows)
    for row in late_rows(world):
        left.remove(row)
    expected = session_reference(left, GAP_MS)
    # Whole-session readers skip the provisional sessions: the closing ones are exact.
    got = subscribed(world.output)
    assert_frame_equal(got, expected.select(got.columns), check_dtypes=False)

    windows = session_output(world.output)
    provisional = [w for w in windows if not w.final]
    assert provisional, "open sessions went out early"
    assert all(is_provisional(w) and w.sessions and w.frontier_batch is None
               and w.part is not None for w in provisional)
    assert all(w.frontier_batch is not None for w in windows if w.final)
    records = [r for r in world.output if r.topic == "out"]
    assert {r.partition for r in records} == {0}, "one partition keeps them in order"

    # The subscriber's running view ends with the closing sessions, no provisional left.
    held = running_view(windows)
    assert not [at for at, h in held.items() if h["provisional"]]
    view = pl.DataFrame([{c: h[c] for c in COLUMNS} for h in held.values()])
    assert_frame_equal(view.sort(SORT), expected.select(COLUMNS), check_dtypes=False)

    # Per (k, start), provisional row counts only grow, up to the covering closing one.
    counts: dict[Session, list[int]] = {}
    for window in provisional:
        for k, start, count in window.frame.select("k", "window_start", "row_count").rows():
            counts.setdefault((k, start), []).append(count)
    closing = expected.select("k", "window_start", "window_end", "row_count").rows()
    for (k, start), seen in counts.items():
        assert seen == sorted(seen), f"{k}@{start}: a provisional count went down: {seen}"
        [covering] = [n for ck, cs, ce, n in closing if ck == k and cs <= start < ce]
        assert seen[-1] <= covering


def test_early_results_change_what_goes_out_not_what_is_kept_or_committed() -> None:
    """The same input, the same crashes, with and without early results: stage 2 holds
    and commits the same repartition offsets, and the closing rows are the same."""
    plain, early = run(1, crashes=True), run(1, crashes=True, emit_every_ms=10)
    assert {p: c[0] for p, c in plain.two_committed.items()} == \
        {p: c[0] for p, c in early.two_committed.items()}
    assert plain.stage_two.waiting() == early.stage_two.waiting() == 0

    def closing(records: Sequence[OutputRecord]) -> pl.DataFrame:
        finals = [w.frame for w in session_output(records) if w.final]
        return pl.concat(finals).select(COLUMNS).sort(SORT)

    assert_frame_equal(closing(plain.output), closing(early.output))


def test_stage_one_sends_its_partial_sessions_at_every_early_result() -> None:
    """Between commit intervals, provisional() sends every unsent partial session (rows
    of one key merged across the instance's partitions), and nothing is left unsent."""
    engine = SessionRunsEngine(EVENT_PLAN, SessionSpec(GAP_MS), event_time=True,
                               time_dtype=UTC_MS, allowed_lateness_ms=0,
                               idle_timeout_ms=IDLE_MS, send_every_ms=60_000)
    for partition in INPUTS[:2]:
        engine.assign(partition, None, None, 0)
    engine.close_due(0)  # the first commit interval starts
    first: list[Row] = [("v", 1_000, 1.0, 1, 1.0), ("w", 1_020, 2.0, 2, 2.0)]
    second: list[Row] = [("v", 1_050, 4.0, 3, 8.0)]
    engine.add(frame(first), [ref(INPUTS[0], 0, first)], 1)
    engine.add(frame(second), [ref(INPUTS[1], 0, second)], 1)
    assert engine.close_due(2) == [], "the commit interval has not passed"
    [window] = engine.provisional(2)
    sent = window.frame.select("k", pl.col("__session_first_ms").alias("first"),
                               pl.col("__session_last_ms").alias("last"),
                               pl.col("__rows").alias("rows")).sort("k")
    assert_frame_equal(sent, pl.DataFrame({"k": ["v", "w"], "first": [1_000, 1_020],
                                           "last": [1_050, 1_020], "rows": [2, 1]}),
                       check_dtypes=False)
    assert engine.cardinality() == 0
    assert engine.provisional(3) == []


def test_stage_two_restart_numbers_provisional_sessions_on() -> None:
    """A replay rebuilds the open sessions and sends them again, numbered past every
    revision that went out before (the commit metadata's revisions_through); the closing
    session is numbered after them, whole."""
    world = World({p: [] for p in INPUTS}, emit_every_ms=10)
    world.start_two()
    world.two_next = {0: 0, 1: 0}
    stage_one = SessionRunsEngine(EVENT_PLAN, SessionSpec(GAP_MS), event_time=True,
                                  time_dtype=UTC_MS, allowed_lateness_ms=0,
                                  idle_timeout_ms=IDLE_MS, send_every_ms=0)
    emitter = PartialEmitter("rep", 1, writer="w", compression="zstd",
                             max_message_bytes=1_000_000)
    stage_one.assign(INPUTS[0], None, None, 0)

    def send(rows: list[Row], offset: int, now_ms: int) -> None:
        stage_one.add(frame(rows), [ref(INPUTS[0], offset, rows)], now_ms)
        closed = stage_one.close_due(now_ms)
        world.repartition[0] += [r for w in closed for r in emitter.window_records(w, EVENT_PLAN)]

    send([("v", 1_000, 1.0, 1, 1.0)], 0, 0)
    world.step_two(10, crash=False)
    world.start_two()  # a restart: the open session is rebuilt from its first record
    world.step_two(20, crash=False)
    send([("v", 1_050, 2.0, 1, 4.0)], 1, 30)
    world.step_two(30, crash=False)
    world.repartition[0] += emitter.progress_records(dict.fromkeys(INPUTS, (5_000, True)), [])
    world.step_two(40, crash=False)
    windows = session_output(world.output)
    assert [(w.final, w.revision, w.kind) for w in windows] == [
        (False, 0, "update"), (False, 1, "update"), (False, 2, "update"), (True, 3, "full")]
    assert [w.frame.get_column("row_count").to_list() for w in windows] == [[1], [1], [2], [2]]
    assert_frame_equal(subscribed(world.output).select("k", "v_sum", "row_count"),
                       pl.DataFrame({"k": ["v"], "v_sum": [3.0], "row_count": [2]}),
                       check_dtypes=False)
