"""Stage 1 of the scale-out: the input partitions' windows go out as partial states.

The pipeline runs as it does on one instance, with ``TimeWindowEngine(partials=True)``;
this emitter sends each closed window's merged partial state to the repartition topic,
cut by a stable hash of the group keys (all partials of a (window, keys) land in one
repartition partition, consumer/core/scale_out/key_hash.py). With every commit it writes a
progress record to every repartition partition: for each input partition this instance
owns, the frontier it has emitted through and whether it is idle, and the windows it
has just sent partials of. One transaction holds partials, progress and input offsets.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import polars as pl

from consumer.core.plan import AggregationPlan
from consumer.core.scale_out.key_hash import partition_of
from consumer.core.types import ClosedWindow, OutputRecord, PartitionKey
from wire.input import Compression
from wire.repartition import (
    KIND_PARTIAL,
    KIND_VALUES,
    ProgressRecord,
    ReportedFrontier,
    encode_partial,
    encode_progress,
)

_PARTITION = "__repartition"


def plan_text(plan: AggregationPlan) -> str:
    """The plan as stage 2 needs it to merge and finalize: keys, functions (a quantile
    with its q) and expressions (their text, checked again where they are read)."""
    return json.dumps({"keys": list(plan.keys),
                       "aggregates": [[a.name, a.func] if a.q is None else [a.name, a.func, a.q]
                                      for a in plan.aggregates],
                       "expressions": [[e.name, e.expression.text] for e in plan.expressions]},
                      separators=(",", ":"), ensure_ascii=False)


class PartialEmitter:
    """The stage-1 ``WindowEmitter``."""

    def __init__(self, topic: str, partitions: int, *, writer: str, compression: Compression,
                 max_message_bytes: int) -> None:
        self._topic = topic
        self._partitions = partitions
        self._writer = writer
        self._compression = compression
        self._max_bytes = max_message_bytes

    def window_records(self, window: ClosedWindow, plan: AggregationPlan,
                       ) -> list[OutputRecord]:
        text = plan_text(plan)
        records = self._by_key_hash(window, window.frame, plan, text, KIND_PARTIAL)
        if window.values is not None:  # what the aggregates that do not decompose read
            records += self._by_key_hash(window, window.values, plan, text, KIND_VALUES)
        return records

    def _by_key_hash(self, window: ClosedWindow, frame: pl.DataFrame, plan: AggregationPlan,
                     text: str, kind: str) -> list[OutputRecord]:
        """``frame``'s rows, each to the repartition partition its keys hash to."""
        hashed = frame.with_columns(
            partition_of(frame, plan.keys, self._partitions).alias(_PARTITION))
        records = []
        for (partition,), rows in hashed.partition_by(_PARTITION, as_dict=True).items():
            pieces = encode_partial(rows.drop(_PARTITION).to_arrow(), start_ms=window.start_ms,
                                    end_ms=window.end_ms, plan=text, kind=kind,
                                    compression=self._compression, max_bytes=self._max_bytes)
            records += [OutputRecord(self._topic, str(window.start_ms).encode(), value,
                                     headers, partition=int(partition))
                        for value, headers in pieces]
        return records

    def progress_records(self, frontiers: Mapping[PartitionKey, tuple[int | None, bool]],
                         closed: Sequence[ClosedWindow]) -> list[OutputRecord]:
        if not frontiers and not closed:
            return []  # no input partition here: nothing to report
        value, headers = encode_progress(ProgressRecord(
            self._writer,
            tuple(ReportedFrontier(topic, partition, frontier, idle)
                  for (topic, partition), (frontier, idle) in sorted(frontiers.items())),
            tuple(sorted({(w.start_ms, w.end_ms) for w in closed}))))
        return [OutputRecord(self._topic, None, value, headers, partition=k)
                for k in range(self._partitions)]
