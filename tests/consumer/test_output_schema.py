"""One output schema per configuration, whatever the mode: one instance, the scale-out,
sessions, late-data revisions (``update``) and the early revisions the memory budget
forces (``delta``) all emit the documented Arrow types (docs/wire-format.md), and so do
inputs whose strings come plain or dictionary-encoded. A subscriber never sees another
schema because the operator scaled out or a worker changed its string encoding."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from consumer.compose import build_pipeline
from consumer.config import settings_from_dict
from consumer.core.types import InputMessage, OutputRecord
from tests.consumer.modes import (
    NOW_MS,
    SOURCE,
    T0,
    TUMBLING,
    committed,
    config,
    scale_out_records,
)
from wire.input import decode_ipc_stream, encode_ipc_stream
from wire.output import OutputWindow, RevisionKind, decode_message

UTC_MS = pa.timestamp("ms", "UTC")
# What docs/wire-format.md promises for this input and the default plan.
DOCUMENTED = pa.schema([
    ("window_start", UTC_MS), ("window_end", UTC_MS), ("site", pa.large_string()),
    ("reading", pa.int64()), ("power", pa.float64()), ("reading_max", pa.float64()),
    ("row_count", pa.int64()),
])
Emitted = list[tuple[pa.Schema, RevisionKind]]  # each output message's schema and kind


def rows(start_ms: int, *, dictionary: bool, sites: tuple[str, ...] = ("a", "b", "c")) -> bytes:
    site = pa.array([sites[i % len(sites)] for i in range(6)])
    return encode_ipc_stream(pa.table({
        "site": site.dictionary_encode() if dictionary else site,
        "ts": pa.array([start_ms + 100 * i for i in range(6)], UTC_MS),
        "reading": pa.array(range(6), pa.int32()),
        "power": [0.5 * i for i in range(6)],
        "reading_max": pa.array([1.5] * 6, pa.float32()),
    }))


def emitted(records: list[OutputRecord]) -> Emitted:
    found: Emitted = []
    for record in records:
        message = decode_message(record.value, record.headers)
        if record.topic == "out" and isinstance(message, OutputWindow):
            found.append((decode_ipc_stream(record.value).schema, message.kind))
    return found


def one_instance(data: dict[str, Any], *, dictionary: bool, late: bool = False) -> Emitted:
    pipe = build_pipeline(settings_from_dict(data))
    pipe.assign(SOURCE, None, None, NOW_MS)
    records = []
    for offset in range(3):
        pipe.process([InputMessage(SOURCE, offset, rows(T0 + offset * 1_000,
                                                        dictionary=dictionary))], NOW_MS)
        records += committed(pipe, NOW_MS)
    if late:  # a row for the first window, closed and kept for revisions
        pipe.process([InputMessage(SOURCE, 3, rows(T0, dictionary=dictionary, sites=("a",)))],
                     NOW_MS)
        records += committed(pipe, NOW_MS)
    return emitted(records + committed(pipe, NOW_MS + 120_000, force=True))


def scaled_out(*, dictionary: bool) -> Emitted:
    """Two instances, both stages, on the in-memory broker."""
    return emitted(scale_out_records(lambda start_ms: rows(start_ms, dictionary=dictionary)))


MODES: dict[str, Callable[[bool], Emitted]] = {
    "one instance": lambda d: one_instance(config(TUMBLING), dictionary=d),
    "scale-out": lambda d: scaled_out(dictionary=d),
    "sessions": lambda d: one_instance(config({"kind": "session", "gap_ms": 300}),
                                       dictionary=d),
    "revisions": lambda d: one_instance(
        config({**TUMBLING, "late": "revise", "revision_lateness_ms": 10_000}),
        dictionary=d, late=True),
    "early revisions": lambda d: one_instance(
        config(TUMBLING, input={"topics": ["in"], "max_groups": 2,
                                "over_budget": "emit_early"}), dictionary=d),
}
# The revision kinds a mode must have shown for the comparison to cover it.
SHOWN = {"revisions": "update", "early revisions": "delta"}


@pytest.mark.parametrize("dictionary", [False, True], ids=["plain", "dictionary"])
@pytest.mark.parametrize("mode", list(MODES))
def test_every_mode_emits_the_documented_schema(mode: str, dictionary: bool) -> None:
    found = MODES[mode](dictionary)
    assert found, "the mode emitted no window"
    if mode in SHOWN:
        assert SHOWN[mode] in {kind for _, kind in found}
    for schema, _ in found:
        # window.late: revise adds its documented revision column last.
        expected = DOCUMENTED.append(pa.field("revision", pa.int64())) if (
            mode == "revisions") else DOCUMENTED
        assert schema.remove_metadata() == expected
        assert all(field.metadata is None for field in schema), "no Polars-private metadata"
