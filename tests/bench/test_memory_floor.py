"""The memory floor: live memory stage by stage, with freed pages handed back at once."""

from __future__ import annotations

from typing import Any

from bench import memory_floor
from consumer.core.aggregate import PartialAggregator
from consumer.core.emit import ResultEmitter


def test_each_stage_peak_is_read_in_a_process_that_purges_at_once() -> None:
    run = memory_floor.measure(1e8, 2_000, 1)  # 25 polls of one message: two windows close
    assert run["allocator"].endswith(memory_floor.PURGE_AT_ONCE)
    assert run["rows"] == 1_250_000
    assert set(run["stages"]) == {"partial", "merge", "finalize", "encode"}
    for stage in run["stages"].values():
        assert stage["calls"] >= 2
        # The peak counts from the reset, a moment after the start was read: RSS may have
        # fallen by a page or two in between, never by a megabyte.
        assert stage["peak_mb"] > stage["start_mb"] - 1 > 0
    assert run["steady_live_mb"] > 0


def test_the_stages_are_the_classes_own_methods_again_afterwards() -> None:
    methods = [PartialAggregator.partial, PartialAggregator.merge,
               PartialAggregator.finalize, ResultEmitter.window_records]
    run = memory_floor.stream_live(2e7, 100, 1)
    assert run["stages"]["partial"]["calls"] == 5
    assert [PartialAggregator.partial, PartialAggregator.merge,
            PartialAggregator.finalize, ResultEmitter.window_records] == methods


def run_at(groups: int, steady_mb: float, peaks_mb: list[float]) -> dict[str, Any]:
    return {"groups": groups, "steady_live_mb": steady_mb,
            "stages": {f"stage{i}": {"peak_mb": peak} for i, peak in enumerate(peaks_mb)}}


def test_bytes_a_group_count_mib_as_2_to_the_20() -> None:
    # 1 MiB more over 1,024 more groups: 1,024 bytes a group; the top peaks differ by 2 MiB.
    per_group = memory_floor.bytes_a_group(run_at(1_024, 100.0, [120.0, 110.0]),
                                           run_at(2_048, 101.0, [115.0, 122.0]))
    assert per_group == {"steady": 1024.0, "working_set": 2048.0}
