"""RSS while streaming through the kernel path (decode + engine + encode), in a subprocess.

10 GB through Kafka takes too long on a small machine, so the bytes come from a pool of
pre-encoded payloads, replayed. Replayed event times would be late, so the windows are
processing-time windows on a synthetic clock (one tick per poll of ``poll_messages``
messages, ``POLLS_PER_WINDOW`` ticks a window), with the keys configured as (site,
sensor); decode, the engine's partial/merge/close and the output encoding are the
daemon's. The worker samples VmRSS after every poll and reports VmHWM at the end.

    python -m bench.memory '{"bytes": 1e9, "groups": 10000, "poll_messages": 16}'
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from typing import Any

from bench.machine import rss_kb
from bench.payloads import build
from bench.sizes import KernelCase
from consumer.core.decode import Decoder, poll_frame
from consumer.core.engine.time import TimeWindowEngine
from consumer.core.plan import derive_plan
from consumer.core.types import MessageRef
from consumer.core.windows import WindowSpec
from wire.input import DecodeLimits
from wire.output import encode_window

ROWS_PER_MESSAGE = 50_000
POLLS_PER_WINDOW = 10
_PARTITION = ("memory", 0)


def stream(total_bytes: float, groups: int, poll_messages: int) -> dict[str, Any]:
    pool_size = max(poll_messages, math.ceil(groups / ROWS_PER_MESSAGE))
    pool = build(KernelCase("pool", pool_size, ROWS_PER_MESSAGE, groups, pool_size), "plain")
    decoder = Decoder(lambda s: derive_plan(s, keys=["site", "sensor"]), limits=DecodeLimits(),
                      max_message_bytes=64 << 20)
    engine: TimeWindowEngine | None = None
    baseline_kb, _ = rss_kb()
    samples: list[tuple[int, int]] = []
    streamed = rows = offset = 0
    tick = 0
    while streamed < total_bytes:
        tables, refs = [], []
        for _ in range(poll_messages):
            value = pool.values[offset % pool_size]
            decoded = decoder.decode(value, None)
            tables.append(decoded.table)
            refs.append(MessageRef(_PARTITION, offset, decoded.table.num_rows))
            streamed += len(value)
            rows += decoded.table.num_rows
            offset += 1
        if engine is None:
            assert decoder.plan is not None  # noqa: S101
            engine = TimeWindowEngine(decoder.plan, WindowSpec.tumbling(POLLS_PER_WINDOW),
                                      event_time=False, time_dtype=None, allowed_lateness_ms=0,
                                      idle_timeout_ms=1 << 40, merge_every=8)
            engine.assign(_PARTITION, None, None, 0)
        engine.add(poll_frame(tables), refs, tick)
        for window in engine.close_due(tick):
            encode_window(window, fmt="arrow", compression="zstd", max_bytes=1_000_000)
        tick += 1
        samples.append((streamed, rss_kb()[0]))
    _, peak_kb = rss_kb()
    late = [kb for at, kb in samples if at >= streamed / 2]
    return {"bytes": streamed, "rows": rows, "groups": groups,
            "pool_bytes": pool.nbytes, "baseline_rss_mb": baseline_kb / 1024,
            "steady_rss_mb": statistics.median(late) / 1024, "peak_rss_mb": peak_kb / 1024,
            "rss_samples_mb": [(at, kb / 1024)
                               for at, kb in samples[:: max(1, len(samples) // 50)]]}


def measure(total_bytes: float, groups: int, poll_messages: int) -> dict[str, Any]:
    """Run ``stream`` in a fresh interpreter, so its RSS is this run's alone."""
    spec = json.dumps({"bytes": total_bytes, "groups": groups, "poll_messages": poll_messages})
    done = subprocess.run([sys.executable, "-m", "bench.memory", spec], capture_output=True,
                          text=True, check=False, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"the memory worker failed: {done.stderr.strip()[-800:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


if __name__ == "__main__":
    args = json.loads(sys.argv[1])
    print(json.dumps(stream(float(args["bytes"]), int(args["groups"]),
                            int(args["poll_messages"]))))
