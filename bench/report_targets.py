"""The targets of issue 37 for the table ``make bench`` heads ``docs/benchmarks.md`` with.

Issue 15's DataFusion ratios stay as references, not targets (Polars at its best doing
the same job measured 0.42-0.86x DataFusion on this machine); what remains is the
distance to the floor: the kernel within 1.15x of the Polars floor's time in the same
run, the daemon within 5% of the Polars reader end to end. The memory target gets the
peers' figures beside it, as anchors.
"""

from __future__ import annotations

from typing import Any

from bench import kernel_floor

Row = tuple[str, str, bool | None]
READER_GOAL = 0.95  # the daemon's rows/s over the Polars reader's
FLOOR_NAMES = {"polars_with_output": "one group_by", "polars_per_poll": "per poll",
               "polars_read_ahead": "per poll, read ahead"}


def kernel_rows(results: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for case in results.get("kernel", []):
        peers = case["peers"]
        ours = peers["arrowagg"]["rows_per_s"]
        label = f"{case['case']}, {case['encoding']}"
        if (found := kernel_floor.over_floor(case)) is not None:
            best, ratio = found
            target = f"kernel within {kernel_floor.GOAL}x the Polars floor's time ({label})"
            rows.append((target, f"{ratio:.2f}x ({FLOOR_NAMES[best]})",
                         ratio <= kernel_floor.GOAL))
        if case["groups"] < 1_000_000:
            ratio = ours / peers["polars_naive"]["rows_per_s"]
            rows.append((f"kernel >= 3.0x naive Polars ({label})", f"{ratio:.2f}x",
                         ratio >= 3.0))
        ratio = ours / peers["datafusion"]["rows_per_s"]
        rows.append((f"kernel / DataFusion ({label}): a reference, not a target",
                     f"{ratio:.2f}x", None))
    return rows


def reader_rows(results: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for encoding, readers in results.get("e2e", {}).get("encodings", {}).items():
        if "polars_reader" in readers:
            ratio = readers["daemon"]["rows_per_s"] / readers["polars_reader"]["rows_per_s"]
            rows.append((f"end to end >= {READER_GOAL}x the Polars reader ({encoding})",
                         f"{ratio:.2f}x", ratio >= READER_GOAL))
    return rows


def memory_anchors(results: dict[str, Any]) -> str:
    """The peers' bytes per open group end to end, for the memory target's row."""
    figures = results.get("e2e", {}).get("peer_memory", {})
    measured = [f"{fig['label']} {fig['bytes_per_group']:,.0f}"
                for fig in figures.values() if "bytes_per_group" in fig]
    return f"; end to end: {', '.join(measured)}" if measured else ""
