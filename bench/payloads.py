"""Pre-encoded input: the Kafka message values every peer is given, built once.

Messages come in event-time order, ``messages_per_window`` to each 10-second tumbling
window; within a window they take turns through the (site, sensor) pairs, so every window
holds every group once ``messages_per_window * rows_per_message >= groups``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc

from bench.sizes import KernelCase
from producer.generate import sensor_batch
from wire.input import dictionary_keys, encode_ipc_stream

WINDOW_MS = 10_000
START_MS = 1_735_689_600_000  # 2025-01-01T00:00:00Z, on a window boundary
Encoding = Literal["plain", "dictionary"]
# plain: utf8 keys, what any pyarrow worker sends; dictionary: what wire.input's
# dictionary_keys makes of them (what arrowagg's Publisher sends by default).
ENCODINGS: tuple[Encoding, ...] = ("plain", "dictionary")


@dataclass(frozen=True)
class Payloads:
    case: KernelCase
    encoding: Encoding
    values: list[bytes]

    @property
    def rows(self) -> int:
        return self.case.messages * self.case.rows_per_message

    @property
    def nbytes(self) -> int:
        return sum(len(v) for v in self.values)

    @property
    def windows(self) -> int:
        return -(-self.case.messages // self.case.messages_per_window)


def window_tables(case: KernelCase, encoding: Encoding, window: int) -> Iterator[pa.Table]:
    """The tables of one window's messages."""
    for slot in range(case.messages_per_window):
        table = sensor_batch(
            rows=case.rows_per_message, groups=case.groups,
            start_ms=START_MS + window * WINDOW_MS, span_ms=WINDOW_MS,
            seed=window * 1_000 + slot, first_group=slot * case.rows_per_message,
        )
        yield dictionary_keys(table) if encoding == "dictionary" else table


def build(case: KernelCase, encoding: Encoding) -> Payloads:
    """Encode the slot tables once and shift their timestamps window by window."""
    bases = list(window_tables(case, encoding, 0))
    values = []
    for index in range(case.messages):
        window, slot = divmod(index, case.messages_per_window)
        values.append(encode_ipc_stream(shifted(bases[slot], window * WINDOW_MS)))
    return Payloads(case, encoding, values)


def shifted(table: pa.Table, by_ms: int) -> pa.Table:
    ts = table.schema.get_field_index("ts")
    kind = table.schema.field(ts).type
    moved = pc.add(table.column(ts).cast(pa.int64()), by_ms).cast(kind)
    return table.set_column(ts, table.schema.field(ts), moved)


def sentinel(encoding: Encoding, window: int) -> bytes:
    """A one-row message in a far later window: it moves the watermark past every window
    of the data, so they all close without waiting for an idle timeout."""
    case = KernelCase("sentinel", 1, 1, 1, 1)
    (table,) = window_tables(case, encoding, window)
    return encode_ipc_stream(table)
