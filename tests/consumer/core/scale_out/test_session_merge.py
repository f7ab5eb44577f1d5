"""Session windows through both stages of the scale-out, with no broker: three stage-1
instances pre-aggregate their input partitions into partial sessions, two repartition
partitions merge them; stages crash and restart from what they committed. What
subscribers hold equals DuckDB's sort-and-scan over the rows not sent late, one row per
session, and the late rows are exactly those the rule names (checked by a plain loop)."""

from __future__ import annotations

import logging
import statistics

import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

from consumer.core.scale_out.session_runs import SessionRunsEngine
from consumer.core.scale_out.stage_one import PartialEmitter
from consumer.core.windows.session.spans import SessionSpec
from tests.consumer.core.scale_out.session_world import (
    GAP_MS,
    IDLE_MS,
    INPUTS,
    OneStageOne,
    World,
    late_by_rule,
    late_rows,
    run,
    subscribed,
)
from tests.consumer.core.windows.helpers import EVENT_PLAN, UTC_MS, frame, ref
from tests.consumer.core.windows.session.harness import (
    HOLISTIC_PLAN,
    HOLISTIC_SQL,
    SORT,
    session_reference,
)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("crashes", [False, True], ids=["steady", "crashes"])
def test_partial_sessions_from_three_instances_merge_into_the_reference(
        seed: int, crashes: bool) -> None:
    world = run(seed, crashes=crashes)
    rows = [r for log in world.inputs.values() for m in log for r in m]
    late = sorted(late_rows(world))
    assert late == sorted(late_by_rule(world.inputs)), "late rows, once each, by the rule"
    left = list(rows)
    for row in late:
        left.remove(row)
    got = subscribed(world.output)
    assert got.select(SORT).is_duplicated().sum() == 0, "one row per session"
    assert_frame_equal(got, session_reference(left, GAP_MS).select(got.columns),
                       check_dtypes=False)
    assert int(got.get_column("row_count").sum()) + len(late) == len(rows), "none lost"


HOLISTIC_COLUMNS = ("window_start", "window_end", "k", "v_sum", "n_count", "v_max", "spread",
                    "row_count")


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("crashes", [False, True], ids=["steady", "crashes"])
def test_sessions_values_travel_with_their_partials_to_the_reference(
        seed: int, crashes: bool) -> None:
    """median, quantile, n_unique and an expression need every row of a session: stage 1
    sends each partial session's values after it, stage 2 gathers them as partials merge
    (from three instances, with crashes of either stage)."""
    world = run(seed, crashes=crashes, plan=HOLISTIC_PLAN)
    rows = [r for log in world.inputs.values() for m in log for r in m]
    late = sorted(late_rows(world))
    assert late == sorted(late_by_rule(world.inputs)), "late rows, once each, by the rule"
    left = list(rows)
    for row in late:
        left.remove(row)
    got = subscribed(world.output, HOLISTIC_COLUMNS)
    assert got.select(SORT).is_duplicated().sum() == 0, "one row per session"
    expected = session_reference(left, GAP_MS, aggregates=HOLISTIC_SQL)
    assert_frame_equal(got, expected.select(got.columns), check_dtypes=False)
    assert int(got.get_column("row_count").sum()) + len(late) == len(rows), "none lost"
    assert world.stage_two.buffered_values() == 0, "closed sessions' values are dropped"


def test_an_idle_partition_returning_behind_the_floor_is_late_as_aggregates() -> None:
    """Partial sessions starting before what a part has emitted go to the late topic."""
    stage = OneStageOne()
    world, emitter, engine = stage.world, stage.emitter, stage.engine
    engine.add(frame([("v", 1_000, 1.0, 1, 1.0)]), [ref(INPUTS[0], 0, [("v", 1_000, 1.0, 1, 1.0)])],
               0)
    closed = engine.close_due(0)
    records = [r for w in closed for r in emitter.window_records(w, EVENT_PLAN)]
    records += emitter.progress_records(engine.frontiers(5_000), closed)  # all idle
    late_row = ("v", 900, 2.0, 1, 2.0)
    engine.add(frame([late_row]), [ref(INPUTS[1], 0, [late_row])], 5_000)  # idle, it comes back
    closed = engine.close_due(5_000)
    later = [r for w in closed for r in emitter.window_records(w, EVENT_PLAN)]
    world.repartition = {0: records, 1: []}
    world.two_next = {0: 0, 1: 0}
    world.step_two(5_000, crash=False)
    assert_frame_equal(subscribed(world.output).select("k", "v_sum", "row_count"),
                       pl.DataFrame({"k": ["v"], "v_sum": [1.0], "row_count": [1]}),
                       check_dtypes=False)
    world.repartition[0] += later
    world.step_two(5_000, crash=False)
    late = [r for r in world.output if r.topic == "late"]
    assert len(late) == 1
    assert dict(late[0].headers)["arrowagg.late.kind"] == b"aggregate"


def test_one_instances_partitions_send_one_session_of_a_key() -> None:
    """Rows of one key in two partitions of one instance, within a gap of each other:
    stage 1's record holds them as one partial session, stage 2 emits one session."""
    engine = SessionRunsEngine(EVENT_PLAN, SessionSpec(GAP_MS), event_time=True,
                               time_dtype=UTC_MS, allowed_lateness_ms=0,
                               idle_timeout_ms=IDLE_MS, send_every_ms=0)
    for partition in INPUTS[:2]:
        engine.assign(partition, None, None, 0)
    first, second = [("v", 1_000, 1.0, 1, 1.0)], [("v", 1_050, 2.0, 1, 4.0)]
    engine.add(frame(first), [ref(INPUTS[0], 0, first)], 0)
    engine.add(frame(second), [ref(INPUTS[1], 0, second)], 0)
    (window,) = engine.close_due(0)
    assert window.frame.height == 1
    world = World({p: [] for p in INPUTS})
    world.start_two()
    emitter = PartialEmitter("rep", 1, writer="w", compression="zstd",
                             max_message_bytes=1_000_000)
    records = emitter.window_records(window, EVENT_PLAN)
    records += emitter.progress_records(dict.fromkeys(INPUTS, (5000, True)), [window])
    world.repartition = {0: records, 1: []}
    world.two_next = {0: 0, 1: 0}
    world.step_two(5_000, crash=False)
    assert_frame_equal(subscribed(world.output).select("k", "v_sum", "v_max", "row_count"),
                       pl.DataFrame({"k": ["v"], "v_sum": [3.0], "v_max": [4.0],
                                     "row_count": [2]}), check_dtypes=False)


def test_a_sessions_values_in_many_pieces_all_reach_its_median() -> None:
    """A partial session whose values take several records (message size limit)."""
    rows = [("v", 1_000 + i, float(i * 7 % 101), i % 13, float(i % 17)) for i in range(300)]
    engine = SessionRunsEngine(HOLISTIC_PLAN, SessionSpec(GAP_MS), event_time=True,
                               time_dtype=UTC_MS, allowed_lateness_ms=0,
                               idle_timeout_ms=IDLE_MS, send_every_ms=0)
    engine.assign(INPUTS[0], None, None, 0)
    engine.add(frame(rows), [ref(INPUTS[0], 0, rows)], 0)
    (window,) = engine.close_due(0)
    emitter = PartialEmitter("rep", 1, writer="w", compression="zstd", max_message_bytes=1_500)
    records = emitter.window_records(window, HOLISTIC_PLAN)
    kinds = [dict(r.headers)["arrowagg.kind"] for r in records]
    assert kinds.count(b"values") > 1, "the values take several records"
    records += emitter.progress_records(dict.fromkeys(INPUTS, (5_000, True)), [window])
    world = World({p: [] for p in INPUTS}, plan=HOLISTIC_PLAN)
    world.start_two()
    world.repartition = {0: records, 1: []}
    world.two_next = {0: 0, 1: 0}
    world.step_two(5_000, crash=False)
    got = subscribed(world.output, HOLISTIC_COLUMNS)
    assert_frame_equal(got, session_reference(rows, GAP_MS, aggregates=HOLISTIC_SQL)
                       .select(got.columns), check_dtypes=False)


def test_a_late_partial_session_goes_out_with_its_values() -> None:
    """A partial session starting before what stage 2 emitted is late: its values come
    after it, and the late topic's aggregates are over them (plain median here)."""
    stage = OneStageOne(plan=HOLISTIC_PLAN)
    world, emitter, engine = stage.world, stage.emitter, stage.engine
    first = [("v", 1_000, 1.0, 1, 1.0)]
    engine.add(frame(first), [ref(INPUTS[0], 0, first)], 0)
    closed = engine.close_due(0)
    records = [r for w in closed for r in emitter.window_records(w, HOLISTIC_PLAN)]
    records += emitter.progress_records(engine.frontiers(5_000), closed)  # all idle
    late_rows = [("v", 900, 2.0, 1, 2.0), ("v", 950, 8.0, 2, 3.0), ("v", 960, 3.0, 2, 4.0)]
    engine.add(frame(late_rows), [ref(INPUTS[1], 0, late_rows)], 5_000)
    closed = engine.close_due(5_000)
    later = [r for w in closed for r in emitter.window_records(w, HOLISTIC_PLAN)]
    later += emitter.progress_records(engine.frontiers(5_000), closed)
    world.repartition = {0: records, 1: []}
    world.two_next = {0: 0, 1: 0}
    world.step_two(5_000, crash=False)
    world.repartition[0] += later
    world.step_two(5_000, crash=False)
    late = [r for r in world.output if r.topic == "late"]
    assert len(late) == 1
    got = pl.from_arrow(pa.ipc.open_stream(late[0].value).read_all())
    assert isinstance(got, pl.DataFrame)
    assert got.select("v_sum", "n_count", "row_count").row(0) == (
        statistics.median(r[2] for r in late_rows), len({r[3] for r in late_rows}),
        len(late_rows))



def test_over_its_budget_stage_two_keeps_its_sessions_and_says_so_once_a_crossing(
        caplog: pytest.LogCaptureFixture) -> None:
    """A session leaves stage 2 only once complete (no other instance can still send a
    part of it), so over input.max_groups stage 2 keeps them all, says so once each time
    it goes over (not at every flush), and the sessions are as without a budget."""
    stage = OneStageOne(budget=(2, 1_000_000))
    first = [("a", 1_000, 1.0, 1, 1.0), ("b", 1_000, 2.0, 1, 2.0), ("c", 1_010, 4.0, 1, 4.0)]
    more = [("a", 1_050, 8.0, 1, 8.0), ("b", 1_060, 16.0, 1, 16.0)]
    again = [("a", 6_000, 32.0, 1, 32.0), ("c", 6_000, 64.0, 1, 64.0)]
    with caplog.at_level(logging.WARNING, logger="consumer.core.scale_out.stage_two"):
        stage.turn(0, first)  # three sessions held: over
        stage.turn(100, more, offset=1)  # still over: not said again
        stage.turn(150)
        stage.turn(4_000)  # every partition idle: the sessions go out, none held
        assert stage.world.stage_two.groups() == 0
        stage.turn(4_050)  # a flush under the budget
        stage.turn(4_100, again, offset=2)  # two held: over again
        stage.turn(9_000)
    said = [r.getMessage() for r in caplog.records if "over input.max_groups" in r.getMessage()]
    assert len(said) == 2, said
    assert "only once complete" in said[0]
    got = subscribed(stage.world.output)
    assert_frame_equal(got, session_reference([*first, *more, *again], GAP_MS)
                       .select(got.columns), check_dtypes=False)
