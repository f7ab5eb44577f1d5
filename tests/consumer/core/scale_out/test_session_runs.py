"""Stage 1 of the session scale-out under ``window.late: revise``: a late row no earlier
than its partition's watermark less ``revision_lateness_ms`` goes out in a partial
session (stage 2 may revise with it); only rows further behind go to the late topic.
Checked against a plain loop over each partition's log, with stage-1 crashes."""

from __future__ import annotations

import pyarrow as pa
import pytest

from consumer.core.scale_out.session_runs import (
    PARTIAL_FIRST,
    PARTIAL_LAST,
    SessionRunsEngine,
)
from consumer.core.types import ROWS
from consumer.core.windows.session.spans import SessionSpec
from tests.consumer.core.scale_out.session_world import (
    GAP_MS,
    IDLE_MS,
    INPUTS,
    World,
    late_by_rule,
    late_rows,
    run,
)
from tests.consumer.core.windows.helpers import EVENT_PLAN, UTC_MS, frame, ref
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
