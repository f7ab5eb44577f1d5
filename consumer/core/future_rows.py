"""Rows from the future: event times beyond the wall clock plus ``window.max_future_ms``.

One such row would move its partition's watermark years ahead: every window would
close, every later row would be late, and the time would be restored from the commit
metadata after a restart. Kafka's brokers guard their own timestamps the same way
(``log.message.timestamp.after.max.ms``, KIP-937, one hour by default). The rows are
taken out of their message and dead-lettered with reason ``future-event-time``; the
rest of the message is aggregated.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc

from consumer.core.decode import DecodedMessage
from consumer.core.offsets import CommitMetadata
from wire.timestamps import rfc3339_ms

log = logging.getLogger(__name__)

REASON = "future-event-time"
# How many of the column's units make a millisecond, and the reverse for seconds.
_PER_MS = {"ms": 1, "us": 1_000, "ns": 1_000_000}


def split_future(decoded: DecodedMessage, time_column: str,
                 bound_ms: int) -> tuple[DecodedMessage, pa.Table]:
    """``decoded`` without its rows whose event time is after ``bound_ms``, and those rows."""
    column = decoded.table.column(time_column)
    unit = column.type.unit if pa.types.is_timestamp(column.type) else "ms"
    raw = column.cast(pa.int64())
    future = pc.greater(raw, _bound_in(unit, bound_ms))
    kept = decoded.table.filter(pc.invert(future))
    extremes = pc.min_max(raw.filter(pc.invert(future)))
    low, high = extremes["min"].as_py(), extremes["max"].as_py()
    kept_message = DecodedMessage(kept, _ms(unit, low), _ms(unit, high))
    return kept_message, decoded.table.filter(future)


def _bound_in(unit: str, bound_ms: int) -> int:
    """The largest value of the column's unit whose millisecond is at most ``bound_ms``."""
    if unit == "s":
        return bound_ms // 1_000
    return bound_ms * _PER_MS[unit] + _PER_MS[unit] - 1


def _ms(unit: str, value: int | None) -> int | None:
    if value is None:
        return None
    if unit == "s":
        return value * 1_000
    return value // _PER_MS[unit]


def without_future_progress(metadata: CommitMetadata | None, bound_ms: int,
                            ) -> CommitMetadata | None:
    """Committed progress with any time after ``bound_ms`` dropped: a watermark poisoned
    by a row from the future (before this guard, or under a larger bound) must not come
    back with the restart that was meant to mend it."""
    if metadata is None:
        return None
    frontier, seen = metadata.frontier, metadata.max_event_ms
    poisoned = [t for t in (frontier, seen) if t is not None and t > bound_ms]
    if not poisoned:
        return metadata
    log.warning("committed progress reaches %s, after now + window.max_future_ms (%s): "
                "ignoring it", rfc3339_ms(max(poisoned)), rfc3339_ms(bound_ms))
    return replace(metadata,
                   frontier=None if frontier is not None and frontier > bound_ms else frontier,
                   max_event_ms=None if seen is not None and seen > bound_ms else seen)
