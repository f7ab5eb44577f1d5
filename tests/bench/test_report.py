"""The targets `make bench` reports, computed from hand-made results."""

from __future__ import annotations

from typing import Any

from bench.report import targets


def sweep_point(groups: int, steady_kib: int) -> dict[str, Any]:
    """One memory sweep point as bench.memory writes it: RSS read in KiB, kept in MiB."""
    return {"groups": groups, "bytes": 4e9, "steady_rss_mb": steady_kib / 1024,
            "peak_rss_mb": steady_kib / 1024}


def memory_target(low: dict[str, Any], high: dict[str, Any]) -> tuple[str, bool | None]:
    [(_, figure, met)] = [row for row in targets({"memory": {"sweep": [low, high]}})
                          if row[0].startswith("memory per open group")]
    return figure, met


def test_memory_per_group_counts_the_rss_in_bytes() -> None:
    # 400 KiB = 409,600 bytes more over 1,000 more groups: 409.6 bytes a group.
    figure, met = memory_target(sweep_point(1_000, 100_000), sweep_point(2_000, 100_400))
    assert (figure, met) == ("410 bytes", False)


def test_memory_per_group_meets_the_target_at_300_bytes() -> None:
    # 3,000 KiB = 3,072,000 bytes over 10,240 groups: exactly 300 bytes a group.
    figure, met = memory_target(sweep_point(10_000, 50_000), sweep_point(20_240, 53_000))
    assert (figure, met) == ("300 bytes", True)
