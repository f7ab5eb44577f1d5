"""The log lines that say what was emitted: one per window and revision (the scale-out's
parts summed), its bounds in RFC 3339, its revision and kind."""

from __future__ import annotations

import polars as pl

from consumer.core.emit import emitted_lines
from consumer.core.types import ClosedWindow

START_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z


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
