"""Session windows against tumbling windows on the same input, through the daemon's own
per-poll pipeline (``bench.daemon_path``): decode, windows, aggregation, close, encode.

    python -m bench.research sessions            # 4M rows, 10k groups
    python -m bench.research sessions --smoke    # a few seconds

The input is the kernel bench's (``bench.payloads``): each group has a row every ~200 ms
of event time, so a 1 s gap makes one long session per group and a 100 ms gap many
short ones. Its messages are in order only window by window (a message spans its whole
10 s window), hence an allowed lateness of one window, or sessions would see late rows.
Reported per configuration: rows/s over the whole run, the most state held (open
windows' groups; open sessions), the result rows emitted and the late rows (none).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.daemon_path import PipelineDriver, bench_settings
from bench.payloads import WINDOW_MS, build
from bench.sizes import KernelCase

_IDLE_MS = 1_000
CONFIGS: dict[str, dict[str, Any]] = {
    "tumbling 10 s": {"kind": "tumbling", "size_ms": WINDOW_MS},
    "session, gap 1 s": {"kind": "session", "gap_ms": 1_000},
    "session, gap 100 ms": {"kind": "session", "gap_ms": 100},
    "session, gap 1 s, max 10 s": {"kind": "session", "gap_ms": 1_000,
                                   "max_session_ms": WINDOW_MS},
}


def run(values: list[bytes], window: dict[str, Any], poll_messages: int) -> dict[str, float]:
    driver = PipelineDriver(bench_settings({
        **window, "time": "event", "timestamp_column": "ts", "allowed_lateness_ms": WINDOW_MS,
        "idle_timeout_ms": _IDLE_MS, "max_future_ms": None}))
    held = emitted = 0
    started = time.perf_counter()
    for first in range(0, len(values), poll_messages):
        closed = driver.poll(values[first:first + poll_messages], 0)
        emitted += sum(w.frame.height for w in closed)
        held = max(held, driver.pipeline.groups())
    emitted += sum(w.frame.height for w in driver.flush(_IDLE_MS + 1))
    return {"seconds": time.perf_counter() - started, "held": held, "emitted": emitted,
            "late": driver.pipeline.counters.late_rows}


def main(argv: Sequence[str] | None = None) -> int:
    smoke = "--smoke" in (sys.argv[1:] if argv is None else argv)
    case = (KernelCase("smoke", 8, 5_000, 1_000, 2) if smoke
            else KernelCase("4M rows, 10k groups", 80, 50_000, 10_000, 10))
    payloads = build(case, "plain")
    poll_messages = 16
    print(f"{case.name}: {payloads.rows:,} rows in {len(payloads.values)} messages, "
          f"{poll_messages} a poll")
    print(f"{'windows':<28} {'rows/s':>12} {'most state':>12} {'rows out':>10} {'late':>6}")
    for name, window in CONFIGS.items():
        best = min((run(payloads.values, window, poll_messages) for _ in range(3)),
                   key=lambda r: r["seconds"])
        print(f"{name:<28} {payloads.rows / best['seconds']:>12,.0f} "
              f"{best['held']:>12,.0f} {best['emitted']:>10,.0f} {best['late']:>6,.0f}")
    return 0

