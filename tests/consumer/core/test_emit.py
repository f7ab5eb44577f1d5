"""Closed windows as output records and as log lines: session output says it is sessions
and names its keys; with revisions, a row's revision comes before the sessions it
replaces, and every record goes to one partition, in the order a subscriber must apply
them. The log says what was emitted: one line per window and revision (the scale-out's
parts summed), its bounds in RFC 3339, its revision and kind."""

from __future__ import annotations

from datetime import UTC, datetime

import polars as pl
import pyarrow as pa

from consumer.core.emit import OutputSpec, ResultEmitter, emitted_lines
from consumer.core.plan import derive_plan
from consumer.core.types import ClosedWindow
from wire.output import decode_output

UTC_MS = pl.Datetime("ms", "UTC")
PLAN = derive_plan(pa.schema([("k", pa.string()), ("v", pa.float64())]))
START_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z


def session_window(kind: str = "update") -> ClosedWindow:
    start = datetime.fromtimestamp(0, UTC)
    frame = pl.DataFrame({"window_start": [start], "window_end": [start], "k": ["a"],
                          "v": [1.0], "row_count": [2], "replaces": [[start]]},
                         schema_overrides={"window_start": UTC_MS, "window_end": UTC_MS,
                                           "replaces": pl.List(UTC_MS)})
    return ClosedWindow(0, 100, frame, 2, revision=3, kind=kind)  # type: ignore[arg-type]


def test_revised_sessions_go_to_one_partition_and_say_what_they_replace() -> None:
    emitter = ResultEmitter(OutputSpec("out", "g", sessions=True, revision_column=True))
    (record,) = emitter.window_records(session_window(), PLAN)
    assert record.partition == 0
    window = decode_output(record.value, record.headers)
    assert (window.sessions, window.keys, window.revision, window.kind) == (
        True, ("k",), 3, "update")
    assert window.frame.columns[-2:] == ["revision", "replaces"]
    assert window.frame["revision"].to_list() == [3]


def test_sessions_without_revisions_and_time_windows_leave_the_partition_to_the_key() -> None:
    for spec in (OutputSpec("out", "g", sessions=True),
                 OutputSpec("out", "g", revision_column=True)):
        (record,) = ResultEmitter(spec).window_records(session_window("full"), PLAN)
        assert record.partition is None
        assert decode_output(record.value, record.headers).sessions == spec.sessions


def window(groups: int, rows: int, **fields: object) -> ClosedWindow:
    frame = pl.DataFrame({"site": [f"s{i}" for i in range(groups)]})
    return ClosedWindow(START_MS, START_MS + 5_000, frame, rows, **fields)  # type: ignore[arg-type]


def test_a_window_in_twelve_parts_is_one_line() -> None:
    parts = [window(3, 40) for _ in range(12)]
    assert emitted_lines(parts) == [
        ("emitted window [2024-01-01T00:00:00.000Z, 2024-01-01T00:00:05.000Z) revision 0 "
        "(full, final): 36 groups from 480 rows in 12 parts")]


def test_revisions_say_their_number_and_kind() -> None:
    lines = emitted_lines([window(2, 10, final=False, kind="delta"),
                           window(1, 3, revision=1, kind="update")])
    assert lines == [
        ("emitted window [2024-01-01T00:00:00.000Z, 2024-01-01T00:00:05.000Z) revision 0 "
        "(delta, not final): 2 groups from 10 rows"),
        ("emitted window [2024-01-01T00:00:00.000Z, 2024-01-01T00:00:05.000Z) revision 1 "
        "(update, final): 1 group from 3 rows")]
