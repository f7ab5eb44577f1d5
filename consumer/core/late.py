"""Late rows as records for ``output.late_topic``.

A row is late when the window it belongs to was already emitted. Late rows are never
aggregated; they are published so that nothing is silently lost: one Arrow IPC stream
per (input message, window), split by rows under the output size limit like windows
are (a burst of late input must not produce a record the broker refuses), with headers
saying where the rows came from and which window they missed. docs/wire-format.md
describes the format.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from consumer.core.types import (
    MESSAGE_INDEX,
    ORIGIN_OFFSET,
    ORIGIN_PARTITION,
    ORIGIN_TOPIC,
    WINDOW_END,
    WINDOW_START,
    ClosedWindow,
    MessageRef,
    OutputRecord,
)
from wire.input import CONTENT_TYPE, HEADER_CHUNK, HEADER_CONTENT_TYPE, Compression, encode_for_size
from wire.output import HEADER_WINDOW_END, HEADER_WINDOW_START

LATE_HEADER_PREFIX = "arrowagg.late."


def late_records(late: pl.DataFrame, refs: Sequence[MessageRef], *, topic: str,
                 compression: Compression, max_bytes: int) -> list[OutputRecord]:
    """``late``: rows with ``window_start``, ``window_end`` and ``MESSAGE_INDEX`` (the
    index in ``refs`` of the message each came from), as an engine returns them; a
    negative index names a message of an earlier poll by the ``ORIGIN_*`` columns."""
    records = []
    named = [c for c in (ORIGIN_TOPIC, ORIGIN_PARTITION, ORIGIN_OFFSET) if c in late.columns]
    groups = late.partition_by(MESSAGE_INDEX, WINDOW_START, as_dict=True, maintain_order=True)
    for (index, start), rows in groups.items():
        ref = refs[int(index)] if int(index) >= 0 else _origin(rows)
        end = int(rows.item(0, WINDOW_END))
        pieces = encode_for_size(rows.drop(MESSAGE_INDEX, *named).to_arrow(),
                                 max_bytes=max_bytes, compression=compression)
        origin = [
            (HEADER_CONTENT_TYPE, CONTENT_TYPE.encode()),
            (LATE_HEADER_PREFIX + "original-topic", ref.partition[0].encode()),
            (LATE_HEADER_PREFIX + "original-partition", str(ref.partition[1]).encode()),
            (LATE_HEADER_PREFIX + "original-offset", str(ref.offset).encode()),
            (HEADER_WINDOW_START, str(start).encode()),
            (HEADER_WINDOW_END, str(end).encode()),
        ]
        key = str(start).encode()
        records += [OutputRecord(topic, key, value,
                                 [*origin, (HEADER_CHUNK, f"{i}/{len(pieces)}".encode())])
                    for i, value in enumerate(pieces, start=1)]
    return records


def late_aggregate_records(late: ClosedWindow, *, topic: str, compression: Compression,
                           max_bytes: int) -> list[OutputRecord]:
    """Scale-out only: partial states of a window stage 2 had already emitted (an input
    partition added while running, say), finalized: the aggregates of the late rows per
    group, which were not in the window's results."""
    pieces = encode_for_size(late.frame.to_arrow(), max_bytes=max_bytes,
                             compression=compression)
    headers = [(HEADER_CONTENT_TYPE, CONTENT_TYPE.encode()),
               (LATE_HEADER_PREFIX + "kind", b"aggregate"),
               (HEADER_WINDOW_START, str(late.start_ms).encode()),
               (HEADER_WINDOW_END, str(late.end_ms).encode())]
    return [OutputRecord(topic, str(late.start_ms).encode(), value,
                         [*headers, (HEADER_CHUNK, f"{i}/{len(pieces)}".encode())])
            for i, value in enumerate(pieces, start=1)]


def _origin(rows: pl.DataFrame) -> MessageRef:
    topic, partition, offset = rows.select(ORIGIN_TOPIC, ORIGIN_PARTITION, ORIGIN_OFFSET).row(0)
    return MessageRef((str(topic), int(partition)), int(offset), rows.height)
