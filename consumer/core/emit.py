"""What closed windows become: the emitters the pipeline hands them to, and the log
lines that say so.

``ResultEmitter`` encodes results for the output topic (one instance, or stage 2 of the
scale-out); ``consumer/core/scale_out/stage_one.py`` has the emitter of the scale-out's stage 1.
``emitted_lines`` says what was emitted, one line per window and revision.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import polars as pl

from consumer.core.plan import AggregationPlan
from consumer.core.types import ClosedWindow, OutputRecord, PartitionKey
from wire.input import Compression
from wire.output import REPLACES_COLUMN, OutputFormat, encode_window
from wire.timestamps import rfc3339_ms

# The result column saying which revision of its window a row is from (window.late:
# revise), after row_count.
REVISION = "revision"


@dataclass(frozen=True)
class OutputSpec:
    """Where records go and how windows are encoded."""

    output_topic: str
    group_id: str
    late_topic: str | None = None
    dlq_topic: str | None = None
    output_format: OutputFormat = "arrow"
    compression: Compression = "zstd"
    max_message_bytes: int = 1_000_000
    drop_late: bool = False  # late rows are counted only (window.late: drop)
    revision_column: bool = False  # results carry their revision (window.late: revise)
    sessions: bool = False  # session windows: each row a session, with its own bounds
    provisional: bool = False  # early results (window.emit_every_ms)


def results_frame(window: ClosedWindow, spec: OutputSpec) -> pl.DataFrame:
    """A window's results as subscribers get them: with its revision, under late: revise
    (sessions: then the sessions each row replaces)."""
    if not spec.revision_column:
        return window.frame
    frame = window.frame.with_columns(pl.lit(window.revision, pl.Int64).alias(REVISION))
    if REPLACES_COLUMN in frame.columns:
        frame = frame.select(pl.exclude(REPLACES_COLUMN), REPLACES_COLUMN)
    return frame


class WindowEmitter(Protocol):
    """Turns closed windows into records: results on the output topic (one instance),
    or partial states on the repartition topic (stage 1 of the scale-out)."""

    def window_records(self, window: ClosedWindow, plan: AggregationPlan,
                       ) -> list[OutputRecord]: ...

    def progress_records(self, frontiers: Mapping[PartitionKey, tuple[int | None, bool]],
                         closed: Sequence[ClosedWindow]) -> list[OutputRecord]:
        """Records to write with every commit (the scale-out's progress markers)."""


class ResultEmitter:
    """One instance: each closed window's results, encoded for the output topic."""

    def __init__(self, routes: OutputSpec) -> None:
        self._routes = routes

    def window_records(self, window: ClosedWindow, plan: AggregationPlan,
                       ) -> list[OutputRecord]:
        routes = self._routes
        frame = results_frame(window, routes)
        messages = encode_window(
            frame, start_ms=window.start_ms, end_ms=window.end_ms,
            input_rows=window.input_rows, fmt=routes.output_format,
            compression=routes.compression, max_bytes=routes.max_message_bytes,
            revision=window.revision, final=window.final, kind=window.kind,
            keys=plan.keys if window.kind == "update" or routes.sessions else None,
            sessions=routes.sessions)
        # A session's revision replaces sessions emitted in other messages, under other
        # keys (each message's key is its earliest window_start), and so does a session
        # that went out provisionally and grew: one partition keeps them in the order they
        # must be applied in.
        in_order = routes.revision_column or routes.provisional
        partition = 0 if routes.sessions and in_order else None
        return [OutputRecord(routes.output_topic, m.key, m.value, m.headers, partition)
                for m in messages]

    def progress_records(self, frontiers: Mapping[PartitionKey, tuple[int | None, bool]],  # noqa: ARG002
                         closed: Sequence[ClosedWindow]) -> list[OutputRecord]:  # noqa: ARG002
        return []


def window_bounds(start_ms: int, end_ms: int) -> str:
    """``[start, end)`` in RFC 3339, as log lines show a window."""
    return f"[{rfc3339_ms(start_ms)}, {rfc3339_ms(end_ms)})"


def emitted_lines(windows: Sequence[ClosedWindow], *, verb: str = "emitted") -> list[str]:
    """One line per window and revision: its bounds, the revision and its kind, groups
    and input rows. The parts of one window (the scale-out's stage 2 emits one per
    repartition partition) are summed into its line, with how many there were."""
    totals: dict[tuple[int, int, int, str, bool], list[int]] = {}
    for window in windows:
        key = (window.start_ms, window.end_ms, window.revision, window.kind, window.final)
        groups, rows, parts = totals.get(key, [0, 0, 0])
        totals[key] = [groups + window.frame.height, rows + window.input_rows, parts + 1]
    lines = []
    for (start, end, revision, kind, final), (groups, rows, parts) in totals.items():
        state = "final" if final else "not final"
        split = f" in {parts} parts" if parts > 1 else ""
        lines.append(f"{verb} window {window_bounds(start, end)} revision {revision} ({kind}, "
                     f"{state}): {_count(groups, 'group')} from {_count(rows, 'row')}{split}")
    return lines


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
