"""The memory target against a purge after each merge: what handing pages back costs.

``bench.research.memory_floor`` found that RSS stays at the merge's working set whenever jemalloc
keeps freed pages, and that purging on every free (``dirty_decay_ms:0``) halves RSS and
doubles the kernel's time. This measures the middle way a daemon could take if Polars let
it: keep the decay, and purge every arena once a merge is done (through Polars'
unexported ``mallctl``, ``bench.research.jemalloc``), only after merges whose state has at least
``--min-rows`` groups (100k by default: a daemon at 10k groups never purges). Both sides
run the daemon's pipeline:

- memory: ``bench.memory``'s stream (steady and peak RSS, bytes an open group between
  10k and 1M groups), each run in a fresh interpreter;
- kernel: ``bench.kernel``'s arrowagg run with dictionary keys, 10k and 1M groups, with
  and without the purge, repetitions interleaved in one process.

It replaces ``PartialAggregator.merge`` for the run: an experiment, which ``make bench``
never does.

    python -m bench.research purge               # 4 GB a memory point, the full kernel cases
    python -m bench.research purge --smoke
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import polars as pl

from bench import kernel, memory
from bench.payloads import build
from bench.research import cases, jemalloc
from bench.research.memory_floor import FULL_POINTS, SMOKE_POINTS
from bench.sizes import FULL, SMOKE, KernelCase
from consumer.core.aggregate import PartialAggregator


@contextmanager
def purging_after_merges(min_rows: int) -> Iterator[list[float]]:
    """While open, a merge whose state has ``min_rows`` groups or more is followed by a
    purge; yields the seconds each purge took."""
    merge = PartialAggregator.merge
    seconds: list[float] = []

    def merge_then_purge(self: PartialAggregator, *args: Any, **kwargs: Any) -> pl.DataFrame:
        state = merge(self, *args, **kwargs)
        if state.height >= min_rows:
            started = time.perf_counter()
            jemalloc.purge()
            seconds.append(time.perf_counter() - started)
        return state

    PartialAggregator.merge = merge_then_purge  # type: ignore[method-assign]
    try:
        yield seconds
    finally:
        PartialAggregator.merge = merge  # type: ignore[method-assign]


def stream(total_bytes: float, groups: int, poll_messages: int,
           min_rows: int | None) -> dict[str, Any]:
    """``bench.memory.stream``, purging after merges unless ``min_rows`` is None."""
    if min_rows is None:
        return {**memory.stream(total_bytes, groups, poll_messages), "purges": 0}
    with purging_after_merges(min_rows) as purges:
        run = memory.stream(total_bytes, groups, poll_messages)
    return {**run, "purges": len(purges), "purge_s": sum(purges)}


def measure_memory(total_bytes: float, groups: int, poll_messages: int,
                   min_rows: int | None) -> dict[str, Any]:
    mode = ["--no-purge"] if min_rows is None else ["--min-rows", str(min_rows)]
    return memory.in_fresh_interpreter(["bench.research.purge", *mode, "--worker"], total_bytes,
                                       groups, poll_messages)


def measure_kernel(case: KernelCase, poll_messages: int, *,
                   min_rows: int) -> dict[str, list[float]]:
    """Seconds of arrowagg's kernel run without and with the purge, interleaved."""
    built = build(case, "dictionary")

    def run(*, purged: bool) -> None:
        with purging_after_merges(min_rows) if purged else nullcontext():
            kernel.run_arrowagg(built, poll_messages)

    return kernel.interleaved_seconds(
        {"kept": lambda: run(purged=False), "purged": lambda: run(purged=True)},
        case.repetitions)


def main(argv: Sequence[str] | None = None) -> int:
    parser = cases.parser("purge", __doc__)
    parser.add_argument("--min-rows", type=int, default=100_000,
                        help="purge only after merges into states of this many groups "
                             "(0: after every merge)")
    parser.add_argument("--no-purge", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        spec = json.loads(args.worker)
        print(json.dumps(stream(float(spec["bytes"]), int(spec["groups"]),
                                int(spec["poll_messages"]),
                                None if args.no_purge else args.min_rows)))
        return 0
    min_rows = args.min_rows
    total, groups, poll = SMOKE_POINTS if args.smoke else FULL_POINTS
    runs = {mode: [measure_memory(total, g, poll, rows) for g in groups]
            for mode, rows in (("kept", None), ("purged", min_rows))}
    for mode, (low, high) in runs.items():
        per_group = memory.bytes_per_group(low["steady_rss_mb"], high["steady_rss_mb"],
                                           low["groups"], high["groups"])
        print(f"memory, freed pages {mode}: steady {low['steady_rss_mb']:.0f} / "
              f"{high['steady_rss_mb']:.0f} MiB, peak {low['peak_rss_mb']:.0f} / "
              f"{high['peak_rss_mb']:.0f} MiB at {low['groups']:,} / {high['groups']:,} "
              f"groups ({high['purges']} purges): {per_group:.0f} bytes an open group",
              flush=True)
    sizes = SMOKE if args.smoke else FULL
    for case in sizes.kernel_cases:
        seconds = measure_kernel(case, sizes.poll_messages, min_rows=min_rows)
        print(f"kernel, {case.name}, dictionary keys: " + ", ".join(
            f"freed pages {mode} {min(s):.3f}-{max(s):.3f} s (median {statistics.median(s):.3f})"
            for mode, s in seconds.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
