"""Stage 1 of the session scale-out under ``window.late: revise``: a late row no earlier
than its partition's watermark less ``revision_lateness_ms`` goes out in a partial
session (stage 2 may revise with it); only rows further behind go to the late topic.
Checked against a plain loop over each partition's log, with stage-1 crashes."""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

from consumer.core.scale_out.session_runs import (
    PARTIAL_FIRST,
    PARTIAL_LAST,
    SessionRunsEngine,
)
from consumer.core.types import ROWS, ClosedWindow, OutputRecord, PartitionKey
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
)
from tests.consumer.core.windows.helpers import EVENT_PLAN, UTC_MS, Row, frame, ref
from tests.consumer.core.windows.session.harness import (
    HOLISTIC_PLAN,
    HOLISTIC_SQL,
    SORT,
    SUMS,
    held_sessions,
    session_reference,
)
from wire.output import OutputWindow, decode_message
from wire.repartition import KIND_PARTIAL, decode_partial, record_kind

REVISE_WITHIN_MS = 300


def _sent_rows(world: World) -> int:
    """Input rows in the committed partial sessions on the repartition topic."""
    total = 0
    for log in world.repartition.values():
        for record in log:
            headers = list(record.headers)
            if record_kind(headers) == KIND_PARTIAL:
                state = decode_partial(record.value, headers).state
                total += int(pa.compute.sum(state.column(ROWS)).as_py())
    return total


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("crashes", [False, True], ids=["steady", "crashes"])
def test_late_rows_within_revision_lateness_go_out_in_partial_sessions(
        seed: int, crashes: bool) -> None:
    world = run(seed, crashes=crashes, revise_within_ms=REVISE_WITHIN_MS)
    rows = [r for log in world.inputs.values() for m in log for r in m]
    beyond = sorted(late_by_rule(world.inputs, REVISE_WITHIN_MS))
    assert len(beyond) < len(late_by_rule(world.inputs)), "the bound takes some late rows"
    assert sorted(late_rows(world)) == beyond, "late rows beyond the bound, once each"
    assert _sent_rows(world) == len(rows) - len(beyond), "every other row sent, once"


def test_a_late_row_within_the_bound_joins_the_partial_and_one_beyond_is_late() -> None:
    engine = SessionRunsEngine(EVENT_PLAN, SessionSpec(GAP_MS), event_time=True,
                               time_dtype=UTC_MS, allowed_lateness_ms=0,
                               idle_timeout_ms=IDLE_MS, send_every_ms=0,
                               revise_within_ms=REVISE_WITHIN_MS)
    engine.assign(INPUTS[0], None, None, 0)
    on_time = [("v", 1_000, 1.0, 1, 1.0)]
    engine.add(frame(on_time), [ref(INPUTS[0], 0, on_time)], 0)
    within, beyond = ("v", 750, 2.0, 1, 2.0), ("v", 650, 4.0, 1, 4.0)  # watermark 1000
    late = engine.add(frame([within, beyond]), [ref(INPUTS[0], 1, [within, beyond])], 0)
    assert late is not None
    assert late.get_column("v_sum").to_list() == [4.0]
    (window,) = engine.close_due(0)
    sent = window.frame.sort(PARTIAL_FIRST)
    assert sent.get_column(PARTIAL_FIRST).to_list() == [750, 1_000]  # 250 apart: two
    assert sent.get_column(PARTIAL_LAST).to_list() == [750, 1_000]
    assert sent.get_column(ROWS).to_list() == [1, 1]


# Seeds 3 and 6 crash stage 2 while it keeps emitted sessions a late partial then reaches.
@pytest.mark.parametrize(("seed", "crashes", "holistic"), [
    (0, False, False), (1, False, False), (3, True, False), (4, True, False), (6, True, False),
    (3, True, True), (6, True, True)])
def test_stage_two_revises_emitted_sessions_into_the_reference(seed: int, crashes: bool,
                                                               holistic: bool) -> None:
    """Late partial sessions within the bound reach sessions stage 2 emitted: it merges
    them and sends updates naming what they replace. Applied, they hold DuckDB's sessions
    over every row not sent late, one per session, with crashes of either stage; with
    median, quantile, n_unique and an expression too (kept sessions keep their values,
    and values sent in pieces of 2 kB find them)."""
    plan, aggregates = (HOLISTIC_PLAN, HOLISTIC_SQL) if holistic else (EVENT_PLAN, SUMS)
    world = run(seed, crashes=crashes, revise_within_ms=REVISE_WITHIN_MS, pauses=True,
                plan=plan, max_message_bytes=2_000 if holistic else 1_000_000)
    rows = [r for log in world.inputs.values() for m in log for r in m]
    late = sorted(late_rows(world))
    assert late == sorted(late_by_rule(world.inputs, REVISE_WITHIN_MS))
    assert not _late(world), "no partial session was late in stage 2"
    left = list(rows)
    for row in late:
        left.remove(row)
    revisions = _revisions(world)
    assert sum(w.frame.height for w in revisions if w.kind == "update") > 0, (
        "some emitted sessions were revised")
    got = held_sessions(revisions, aggregates)
    assert got.select(SORT).is_duplicated().sum() == 0, "one row per session"
    expected = session_reference(left, GAP_MS, aggregates=aggregates)
    assert_frame_equal(got, expected.select(got.columns), check_dtypes=False)


def _revisions(world: World) -> list[ClosedWindow]:
    """The output topic's session rows in the order they were written (one output
    partition keeps it), as windows for the wire rule's subscriber."""
    out = []
    for record in world.output:
        if record.topic != "out":
            continue
        message = decode_message(record.value, list(record.headers))
        if isinstance(message, OutputWindow):
            assert message.chunk == (1, 1)
            assert record.partition == 0, "revisions in one partition, in order"
            out.append(ClosedWindow(message.start_ms, message.end_ms, message.frame,
                                    message.window_rows, final=message.final,
                                    revision=message.revision, kind=message.kind))
    return out


def test_a_late_partial_a_replay_meets_again_stays_out_of_the_kept_session() -> None:
    """An idle partition comes back with a partial session behind kept-after that reaches
    a kept one: it is late (the late topic has it), and its keys are listed. Stage 2
    restarts and replays it: it must not join the kept session (the listing drops it,
    and the kept session with it: those keys take no revision until their next session),
    so a later row for that session is late too and no row counts twice."""
    stage = OneStageOne(revise_within_ms=REVISE_WITHIN_MS)
    world = stage.world

    def publish(partition: PartitionKey, offset: int, rows: list[Row], now_ms: int) -> None:
        stage.turn(now_ms, rows, partition=partition, offset=offset)

    publish(INPUTS[0], 0, [("v", 1_050, 1.0, 1, 1.0), ("w", 1_400, 8.0, 1, 8.0)], 0)
    for now in range(900, 4_500, 900):  # the others go idle
        stage.engine.keep_alive(INPUTS[0], now)
    publish(INPUTS[0], 1, [("w", 1_400, 8.0, 1, 8.0)], 4_500)  # floor 1300, kept-after 1000
    assert held_sessions(_revisions(world)).filter(pl.col("k") == "v").height == 1
    behind = [("v", 870, 2.0, 1, 2.0), ("v", 960, 4.0, 1, 4.0)]  # one partial; reaches v@1050
    publish(INPUTS[1], 0, behind, 4_600)
    assert len(_late(world)) == 1, "the partial behind kept-after is late"
    world.start_two()  # a restart: the replay reads the late partial again
    world.two_next = {0: world.two_committed[("rep", 0)][0] or 0, 1: 0}
    publish(INPUTS[0], 2, [("v", 1_120, 16.0, 1, 16.0)], 4_700)  # within stage 1's bound
    publish(INPUTS[0], 3, [("x", 9_000, 0.0, 1, 0.0)], 9_000)  # every session closes
    got = held_sessions(_revisions(world)).filter(pl.col("k") == "v")
    assert got.select("v_sum", "row_count").rows() == [(1.0, 1)], "v@1050 alone"
    late = pl.concat([decode_message(r.value, list(r.headers)).frame  # type: ignore[union-attr]
                      for r in _late(world)])
    assert sorted(late.select("v_sum", "row_count").rows()) == [(6.0, 2), (16.0, 1)]


def _late(world: World) -> list[OutputRecord]:
    return [r for r in world.output if r.topic == "late"]


def test_a_revision_goes_out_at_once_after_the_stream_has_ended() -> None:
    """Every partition idle and every session out: a late row within the bound then
    reopens a kept session, and the floor will not move again (the frontier an idle
    partition reported stands). The update goes out at the next flush all the same."""
    stage = OneStageOne(revise_within_ms=REVISE_WITHIN_MS)
    world, turn = stage.world, stage.turn
    turn(0, [("v", 1_250, 1.0, 1, 1.0), ("w", 1_400, 2.0, 1, 2.0)])
    turn(2_000)  # all idle: floor 1500, every session out, v kept (kept-after 1200)
    assert [w.kind for w in _revisions(world)] == ["full"]
    turn(2_100, [("v", 1_300, 4.0, 1, 4.0)], offset=1)  # late, within the bound
    revisions = _revisions(world)
    assert [w.kind for w in revisions] == ["full", "update"]
    got = held_sessions(revisions).filter(pl.col("k") == "v")
    assert got.select("v_sum", "row_count").rows() == [(5.0, 2)]
