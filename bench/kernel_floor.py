"""The kernel section's floor: Polars at its best doing arrowagg's whole job, timed in
the same interleaved run as arrowagg and its peers (issue 37's "in the same run").

The floors are ``bench.floor``'s whole-job shapes: the same messages read by pyarrow
without validation, grouped by one streaming ``group_by`` over all rows or poll by poll
as arrowagg does (also with the reading two polls ahead), every window encoded as
arrowagg encodes its own. Each is checked against arrowagg's rows (its output read back)
before it is timed; the fastest is the floor the target is stated against.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench import floor, kernel
from bench.payloads import Payloads

SHAPES: dict[str, Callable[[Payloads, int], Any]] = {
    "polars_with_output": floor.run_polars_with_output,
    "polars_per_poll": floor.run_polars_per_poll,
    "polars_read_ahead": floor.run_polars_read_ahead,
}
GOAL = 1.15  # arrowagg's time over the floor's


def measure(payloads: Payloads, *, repetitions: int, poll_messages: int) -> dict[str, Any]:
    """``kernel.measure`` with the floors in the same interleaved repetitions."""
    return kernel.measure(payloads, repetitions=repetitions, poll_messages=poll_messages,
                          extra=SHAPES, read_back=floor.decoded_rows)


def over_floor(case: dict[str, Any]) -> tuple[str, float] | None:
    """(the fastest floor, arrowagg's median time over its), or None without floors."""
    floors = {name: case["peers"][name]["median_s"] for name in SHAPES if name in case["peers"]}
    if not floors:
        return None
    best = min(floors, key=floors.__getitem__)
    return best, case["peers"]["arrowagg"]["median_s"] / floors[best]
