"""The daemon's own per-poll pipeline (consumer/core/pipeline.py), driven without Kafka.

The kernel and memory benchmarks feed pre-encoded payloads through exactly the object
``StreamProcessor`` calls, built by the same composition root from a configuration, so
what they measure is the daemon's code path: decode, window, pre-aggregate, merge,
close, encode, commit points. Only the broker is missing; every flush counts as
committed at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from consumer.compose import build_pipeline
from consumer.config import settings_from_dict
from consumer.core.pipeline import Pipeline
from consumer.core.types import ClosedWindow, InputMessage

PARTITION = ("bench", 0)


def bench_settings(window: dict[str, Any], **sections: dict[str, Any]) -> dict[str, Any]:
    """A daemon configuration (as the YAML document) for one input partition."""
    return {
        "kafka": {"bootstrap_servers": "unused:9092", "group_id": "bench"},
        "input": {"topics": [PARTITION[0]], "max_message_bytes": 64 << 20},
        "output": {"topic": "bench-out", "compression": "zstd"},
        "window": window,
        **sections,
    }


class PipelineDriver:
    """Feeds polls of message values to the pipeline and collects the closed windows."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.pipeline: Pipeline = build_pipeline(settings_from_dict(config))
        self.pipeline.assign(PARTITION, None, None, 0)
        self._offset = 0

    def poll(self, values: Sequence[bytes], now_ms: int) -> list[ClosedWindow]:
        """One poll: ``values`` are the next messages of the partition."""
        messages = [InputMessage(PARTITION, self._offset + i, value)
                    for i, value in enumerate(values)]
        self._offset += len(values)
        self.pipeline.process(messages, now_ms)
        return self.flush(now_ms)

    def flush(self, now_ms: int) -> list[ClosedWindow]:
        """Close what is due at ``now_ms``; its output counts as committed."""
        flush = self.pipeline.flush(now_ms)
        if flush.commit:
            self.pipeline.committed(flush, now_ms)
        return flush.windows
