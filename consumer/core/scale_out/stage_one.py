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

from consumer.core.plan import AggregationPlan
from consumer.core.scale_out.key_hash import partition_of
from consumer.core.types import ClosedWindow, OutputRecord, PartitionKey
from wire.input import Compression
from wire.repartition import ProgressRecord, ReportedFrontier, encode_partial, encode_progress

_PARTITION = "__repartition"


def plan_text(plan: AggregationPlan) -> str:
    """The plan as stage 2 needs it to merge and finalize: keys and functions."""
    return json.dumps({"keys": list(plan.keys),
                       "aggregates": [[a.name, a.func] for a in plan.aggregates]},
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
        state = window.frame.with_columns(
            partition_of(window.frame, plan.keys, self._partitions).alias(_PARTITION))
        records = []
        text = plan_text(plan)
        for (partition,), rows in state.partition_by(_PARTITION, as_dict=True).items():
            pieces = encode_partial(rows.drop(_PARTITION).to_arrow(), start_ms=window.start_ms,
                                    end_ms=window.end_ms, plan=text,
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
