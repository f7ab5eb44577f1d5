"""arrowagg as the end-to-end peers run: its own process, launched like the daemon.

The shipped defaults (exactly-once, the event-time tumbling window of the bench), the
``StreamProcessor`` that ``python -m consumer run`` runs, SIGTERM/SIGINT to stop. Prints
JSON lines: ``first_input`` (wall time of the first consumed message) and ``committed``
(wall time of the latest transaction that carried windows: when they became readable).

    python bench/arrowagg_app.py BOOTSTRAP INPUT_TOPIC OUTPUT_TOPIC GROUP WINDOW_MS
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Sequence
from types import FrameType

from consumer.compose import build_processor
from consumer.config import settings_from_dict
from consumer.core.types import ClosedWindow, PartitionKey
from consumer.service.observer import NullObserver


class Report(NullObserver):
    """Prints the first consumed message's time and every commit with windows in it."""

    def __init__(self) -> None:
        self.first = False

    def consumed(self, partition: PartitionKey, messages: int, rows: int,  # noqa: ARG002
                 nbytes: int) -> None:  # noqa: ARG002
        if not self.first:
            self.first = True
            print(json.dumps({"first_input": time.time()}), flush=True)

    def committed(self, windows: Sequence[ClosedWindow], closed_at_ms: int,  # noqa: ARG002
                  committed_at_ms: int) -> None:  # noqa: ARG002
        if windows:
            print(json.dumps({"committed": time.time()}), flush=True)


def main(bootstrap: str, source: str, output: str, group: str, window_ms: int) -> int:
    settings = settings_from_dict({
        "kafka": {"bootstrap_servers": bootstrap, "group_id": group},
        "input": {"topics": [source]},
        "output": {"topic": output},
        "window": {"kind": "tumbling", "time": "event", "timestamp_column": "ts",
                   "size_ms": window_ms},
        "processing": {"instance_id": group},
        "service": {"http_port": None, "statistics_interval_ms": 0},
    })
    processor = build_processor(settings, Report())

    def stop(_signum: int, _frame: FrameType | None) -> None:
        processor.request_stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    processor.run()
    return 0


if __name__ == "__main__":
    bootstrap, source, output, group, window = sys.argv[1:6]
    sys.exit(main(bootstrap, source, output, group, int(window)))
