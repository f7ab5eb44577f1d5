"""The names and records the core's modules share: defined once, here.

A partition is ``(topic, partition)``; times are integer epoch milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import polars as pl

from wire.output import RevisionKind

PartitionKey = tuple[str, int]
# Kafka headers as confluent-kafka's Message.headers() gives them.
HeaderPairs = Sequence[tuple[str, str | bytes | None]]

# The result frame's own columns, and the state's row counter.
WINDOW_START = "window_start"
WINDOW_END = "window_end"
ROW_COUNT = "row_count"
ROWS = "__rows"
# In late rows handed back by an engine: which of the poll's messages a row came from.
MESSAGE_INDEX = "__message"
# ... or, for rows of a message of an earlier poll (held back during a session replay;
# MESSAGE_INDEX is then negative), the message itself.
ORIGIN_TOPIC = "__origin_topic"
ORIGIN_PARTITION = "__origin_partition"
ORIGIN_OFFSET = "__origin_offset"

# The window end recorded for a message that fed no window (empty, rejected): done at once.
NO_WINDOW = -(2**63)


@dataclass(frozen=True)
class MessageRef:
    """Where a slice of the frame came from: ``rows`` consecutive rows of one message,
    whose event times (event-time windows) lie in ``[min_event_ms, max_event_ms]``, and
    the message's Kafka timestamp (None when it has none)."""

    partition: PartitionKey
    offset: int
    rows: int
    min_event_ms: int | None = None
    max_event_ms: int | None = None
    timestamp_ms: int | None = None


@dataclass(frozen=True)
class ClosedWindow:
    """One window's result: ``frame`` has window_start, window_end, keys, aggregates,
    row_count. ``final`` is False for an early revision (the memory budget was reached);
    ``kind`` says how a revision relates to the ones before (``RevisionKind``).

    A window closed as a partial state (stage 1 of the scale-out) has the state in
    ``frame`` and, when the plan buffers values, the window's buffered rows in
    ``values`` (window_start, the keys as text, the buffered columns)."""

    start_ms: int
    end_ms: int
    frame: pl.DataFrame
    input_rows: int
    final: bool = True
    revision: int = 0
    kind: RevisionKind = "full"
    values: pl.DataFrame | None = None


@dataclass(frozen=True)
class OutputRecord:
    """One record to produce: a window's piece, a late-rows message or a dead letter."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: HeaderPairs
    partition: int | None = None  # None: the producer's partitioner chooses (by key)


@dataclass(frozen=True)
class InputMessage:
    """One consumed input message, as plain fields: what the pipeline needs of it."""

    partition: PartitionKey
    offset: int
    value: bytes | None
    key: bytes | None = None
    headers: HeaderPairs | None = None
    timestamp_ms: int | None = None


def partition_names(partitions: Iterable[PartitionKey]) -> str:
    """``topic[0], topic[1]`` for log lines; ``nothing`` for none."""
    return ", ".join(f"{topic}[{partition}]" for topic, partition in partitions) or "nothing"
