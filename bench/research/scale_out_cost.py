"""Where the scale-out's price goes: a fixed cost per run, or a cost per row.

``make bench``'s scale-out section times one instance with and without ``scale_out``
from launch to the last window whole, on 1 GB, and finds the two stages at 0.64x. That
one figure mixes two costs that scale differently: what every run pays once (joining a
second group, creating the repartition topic, and the last windows waiting for stage
1's commit and then stage 2's: up to two commit intervals instead of one) and what every
row pays (stage 1 encoding partials, stage 2 decoding and merging them).

This drains the same kind of input (``bench.scale_out``'s topic) at two sizes, in both
modes, interleaved, and fits ``seconds = fixed + rows / rate`` through the medians of
each: the fitted ``rate`` ratio is the per-row price of the stages, the ``fixed``
difference the per-run one. Then it repeats the larger size with a 100 ms commit
interval: if the fixed difference is the commit cadence, it shrinks with it.

    python -m bench.research scale_out_cost            # 0.25 and 1 GB, 3 runs each
    python -m bench.research scale_out_cost --smoke
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Sequence
from typing import Any

from bench import scale_out
from bench.broker import broker, delete_topics
from bench.e2e import prepare
from bench.sizes import GB, MB

MODES = (("one instance", False), ("two stages", True))


def fit(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(fixed seconds, rows per second) of the line through (rows, seconds) points."""
    (r1, s1), (r2, s2) = points
    if r1 == r2:
        raise ValueError("the two sizes hold as many rows: make them further apart")
    per_row = (s2 - s1) / (r2 - r1)
    return s1 - per_row * r1, (1 / per_row if per_row > 0 else float("inf"))


def measure(bootstrap: str, sizes: Sequence[int], repeats: int,
            processing: dict[str, Any] | None = None) -> dict[str, list[tuple[float, float]]]:
    """Per mode, (rows, median seconds) at each size."""
    points: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in MODES}
    for size in sizes:
        topic = prepare(bootstrap, "dictionary", size, scale_out.INPUT_PARTITIONS,
                                  messages_per_window=20)
        try:
            seconds: dict[str, list[float]] = {name: [] for name, _ in MODES}
            for _ in range(repeats):  # interleaved, so a busy moment hits both
                for name, two_stages in MODES:
                    seconds[name].append(scale_out.run(
                        bootstrap, topic, 1, scale_out=two_stages,
                        processing=processing)["seconds"])
            for name, _ in MODES:
                points[name].append((topic.payloads.rows, statistics.median(seconds[name])))
        finally:
            delete_topics(bootstrap, [topic.name])
    return points


def main(argv: Sequence[str] | None = None) -> int:
    smoke = "--smoke" in (sys.argv[1:] if argv is None else argv)
    sizes, repeats = ((30 * MB, 60 * MB), 1) if smoke else ((GB // 4, GB), 3)
    with broker() as bootstrap:
        fitted = {name: fit(points) for name, points in measure(bootstrap, sizes, repeats).items()}
        print(f"{'mode':<14} {'fixed s':>8} {'rows/s, fitted':>16}")
        for name, (fixed, rate) in fitted.items():
            print(f"{name:<14} {fixed:>8.2f} {rate:>16,.0f}")
        one, two = fitted["one instance"], fitted["two stages"]
        print(f"per row, two stages / one instance: {two[1] / one[1]:.2f}x; "
              f"fixed, two stages - one instance: {two[0] - one[0]:+.2f} s")
        cadence = measure(bootstrap, sizes[-1:], repeats, {"commit_interval_ms": 100})
        print("commit interval 100 ms, largest size: " + ", ".join(
            f"{name} {points[0][1]:.2f} s" for name, points in cadence.items()))
    return 0
