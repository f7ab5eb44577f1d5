"""Closed windows as output records: session output says it is sessions and names its
keys; with revisions, a row's revision comes before the sessions it replaces, and every
record goes to one partition, in the order a subscriber must apply them."""

from __future__ import annotations

from datetime import UTC, datetime

import polars as pl
import pyarrow as pa

from consumer.core.emit import OutputSpec, ResultEmitter
from consumer.core.plan import derive_plan
from consumer.core.types import ClosedWindow
from wire.output import decode_output

UTC_MS = pl.Datetime("ms", "UTC")
PLAN = derive_plan(pa.schema([("k", pa.string()), ("v", pa.float64())]))


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
