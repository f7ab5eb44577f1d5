"""RSS while streaming through the kernel path (decode + engine + encode), in a subprocess.

10 GB through Kafka takes too long on a small machine, so the bytes come from a pool of
pre-encoded payloads, replayed. Replayed event times would be late, so the windows are
processing-time windows on a synthetic clock (one tick per poll of ``poll_messages``
messages, ``POLLS_PER_WINDOW`` ticks a window), with the keys configured as (site,
sensor), through the daemon's own pipeline (``bench.daemon_path``). The worker samples
VmRSS after every poll and reports VmHWM at the end.

    python -m bench.memory '{"bytes": 1e9, "groups": 10000, "poll_messages": 16}'
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from typing import Any

from bench.daemon_path import PipelineDriver, bench_settings
from bench.machine import rss_kb
from bench.payloads import build
from bench.sizes import KernelCase

ROWS_PER_MESSAGE = 50_000
POLLS_PER_WINDOW = 10


def stream(total_bytes: float, groups: int, poll_messages: int) -> dict[str, Any]:
    pool_size = max(poll_messages, math.ceil(groups / ROWS_PER_MESSAGE))
    pool = build(KernelCase("pool", pool_size, ROWS_PER_MESSAGE, groups, pool_size), "plain")
    driver = PipelineDriver(bench_settings(
        {"kind": "tumbling", "time": "processing", "size_ms": POLLS_PER_WINDOW},
        aggregation={"keys": ["site", "sensor"]}))
    baseline_kb, _ = rss_kb()
    samples: list[tuple[int, int]] = []
    streamed = rows = offset = 0
    tick = 0
    while streamed < total_bytes:
        values = [pool.values[(offset + i) % pool_size] for i in range(poll_messages)]
        offset += poll_messages
        driver.poll(values, tick)
        streamed += sum(len(v) for v in values)
        tick += 1
        samples.append((streamed, rss_kb()[0]))
    rows = driver.pipeline.counters.rows
    _, peak_kb = rss_kb()
    late = [kb for at, kb in samples if at >= streamed / 2]
    return {"bytes": streamed, "rows": rows, "groups": groups,
            "pool_bytes": pool.nbytes, "baseline_rss_mb": baseline_kb / 1024,
            "steady_rss_mb": statistics.median(late) / 1024, "peak_rss_mb": peak_kb / 1024,
            "rss_samples_mb": [(at, kb / 1024)
                               for at, kb in samples[:: max(1, len(samples) // 50)]]}


def measure(total_bytes: float, groups: int, poll_messages: int) -> dict[str, Any]:
    """Run ``stream`` in a fresh interpreter, so its RSS is this run's alone."""
    return in_fresh_interpreter(["bench.memory"], total_bytes, groups, poll_messages)


def in_fresh_interpreter(command: list[str], total_bytes: float, groups: int,
                         poll_messages: int, env: dict[str, str] | None = None,
                         ) -> dict[str, Any]:
    """The JSON a worker (``python -m`` ``command`` and the stream's spec) prints last."""
    spec = json.dumps({"bytes": total_bytes, "groups": groups, "poll_messages": poll_messages})
    done = subprocess.run([sys.executable, "-m", *command, spec], capture_output=True,
                          text=True, check=False, timeout=3600, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"the worker {command[0]} failed: {done.stderr.strip()[-800:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def bytes_per_group(low_mib: float, high_mib: float, low_groups: int, high_groups: int,
                    ) -> float:
    """Bytes an extra open group costs between two runs; RSS is read from /proc in KiB
    and kept in MiB here (KiB / 1024), so 2**20 bytes to each."""
    return (high_mib - low_mib) * 2**20 / (high_groups - low_groups)


if __name__ == "__main__":
    args = json.loads(sys.argv[1])
    print(json.dumps(stream(float(args["bytes"]), int(args["groups"]),
                            int(args["poll_messages"]))))
