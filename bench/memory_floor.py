"""The floor under the memory target: what the daemon's pipeline holds live, stage by stage.

``bench.memory`` reads RSS, which counts the memory Polars' jemalloc has freed but keeps
as well as what is live. Here the same stream runs with jemalloc told to hand freed pages
back at once (``dirty_decay_ms:0,muzzy_decay_ms:0``: the kernel a half to twice as slow,
so a setting for measuring, not for shipping), so that RSS is live memory, and each
stage's peak over the RSS it started from is read from the kernel's VmHWM, reset
(``/proc/self/clear_refs``) as the stage starts:

- ``partial``: a poll's rows pre-aggregated (at high cardinality passed on ungrouped);
- ``merge``: a window's state and its waiting partials merged into one state;
- ``finalize``: a closing window's state made results;
- ``encode``: the results encoded as output records (Arrow IPC, zstd, 1 MB messages).

The steady live RSS is the pipeline with its open windows' states and the partials
waiting beside them; the highest peak of a stage is the working set, what RSS
stays at with any decay setting that keeps freed pages for a while (bench/text/findings.md,
tenth round). The memory target has to fit the latter.

    python -m bench.memory_floor            # 4 GB at 10k and at 1M groups
    python -m bench.memory_floor --smoke
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.machine import rss_kb
from bench.memory import FULL_POINTS, SMOKE_POINTS, bytes_per_group, in_fresh_interpreter, stream
from consumer.allocator import ALLOCATOR_ENV
from consumer.core.aggregate import PartialAggregator
from consumer.core.emit import ResultEmitter

# Appended to the environment's own setting, so it wins (consumer/allocator.py puts its
# arena count first).
PURGE_AT_ONCE = "dirty_decay_ms:0,muzzy_decay_ms:0"

# Each measured stage: the class and the method that does it.
STAGES: dict[str, tuple[type, str]] = {
    "partial": (PartialAggregator, "partial"), "merge": (PartialAggregator, "merge"),
    "finalize": (PartialAggregator, "finalize"), "encode": (ResultEmitter, "window_records"),
}


def _reset_peak() -> None:
    """Start VmHWM afresh from the current RSS (proc(5), clear_refs: "5")."""
    Path("/proc/self/clear_refs").write_text("5")


@contextmanager
def _peaks_recorded(record: Callable[[str, int, int], None]) -> Iterator[None]:
    """Each stage's calls report (stage, RSS at the start, VmHWM at the end) in KiB."""
    originals = {stage: (owner, name, getattr(owner, name))
                 for stage, (owner, name) in STAGES.items()}
    for stage, (owner, name, method) in originals.items():

        def recorded(*args: Any, _stage: str = stage, _method: Any = method,
                  **kwargs: Any) -> Any:
            start, _ = rss_kb()
            _reset_peak()
            result = _method(*args, **kwargs)
            record(_stage, start, rss_kb()[1])
            return result

        setattr(owner, name, recorded)
    try:
        yield
    finally:
        for owner, name, method in originals.values():
            setattr(owner, name, method)


def stream_live(total_bytes: float, groups: int, poll_messages: int) -> dict[str, Any]:
    """``bench.memory.stream`` with each stage's peak recorded (in this process)."""
    calls: dict[str, list[tuple[int, int]]] = {stage: [] for stage in STAGES}
    with _peaks_recorded(lambda stage, start, peak: calls[stage].append((start, peak))):
        streamed = stream(total_bytes, groups, poll_messages)
    figures = {}
    for stage, seen in calls.items():
        late = seen[len(seen) // 2:]  # the steady half, as bench.memory reads RSS
        figures[stage] = {
            "calls": len(seen),
            "start_mb": max((start for start, _ in late), default=0) / 1024,
            "above_start_mb": max((peak - start for start, peak in late), default=0) / 1024,
            "peak_mb": max((peak for _, peak in late), default=0) / 1024,
        }
    return {"groups": groups, "bytes": streamed["bytes"], "rows": streamed["rows"],
            "allocator": os.environ.get(ALLOCATOR_ENV, ""),
            "steady_live_mb": streamed["steady_rss_mb"], "stages": figures}


def measure(total_bytes: float, groups: int, poll_messages: int) -> dict[str, Any]:
    """``stream_live`` in a fresh interpreter that hands freed memory back at once."""
    env = dict(os.environ)
    env[ALLOCATOR_ENV] = ",".join(filter(None, [env.get(ALLOCATOR_ENV), PURGE_AT_ONCE]))
    return in_fresh_interpreter(["bench.memory_floor", "--worker"], total_bytes, groups,
                                poll_messages, env=env)


def bytes_a_group(low: dict[str, Any], high: dict[str, Any]) -> dict[str, float]:
    """Live bytes an open group between two runs: steady, and at the highest stage peak."""
    def top(run: dict[str, Any]) -> float:
        return float(max(stage["peak_mb"] for stage in run["stages"].values()))

    groups = low["groups"], high["groups"]
    return {"steady": bytes_per_group(low["steady_live_mb"], high["steady_live_mb"], *groups),
            "working_set": bytes_per_group(top(low), top(high), *groups)}


def _worker(spec: str) -> None:
    args = json.loads(spec)
    print(json.dumps(stream_live(float(args["bytes"]), int(args["groups"]),
                                 int(args["poll_messages"]))))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memory_floor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args.worker)
        return 0
    total, groups, poll = SMOKE_POINTS if args.smoke else FULL_POINTS
    runs = [measure(total, g, poll) for g in groups]
    for run in runs:
        stage_text = ", ".join(
            f"{name} {s['peak_mb']:.0f} (up to {s['above_start_mb']:.0f} over its start)"
            for name, s in run["stages"].items())
        print(f"{run['groups']:,} groups: steady live {run['steady_live_mb']:.0f} MiB; "
              f"stage peaks, MiB: {stage_text}")
    per_group = bytes_a_group(runs[0], runs[-1])
    print(f"bytes an open group: {per_group['steady']:.0f} live at the steady state, "
          f"{per_group['working_set']:.0f} at the working set's peak")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
