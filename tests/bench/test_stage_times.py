"""The stage timings of arrowagg's kernel run and the floor's, at toy size."""

from __future__ import annotations

from bench import kernel, payloads, stage_times
from bench.sizes import KernelCase
from consumer.core.aggregate import PartialAggregator
from wire import input as wire_input
from wire import validate


def test_every_stage_is_timed_and_the_patches_come_off() -> None:
    built = payloads.build(KernelCase("toy", 4, 500, 50, 2), "plain")
    partial = PartialAggregator.partial
    stages = stage_times.arrowagg_stages(built, 2)
    assert PartialAggregator.partial is partial
    assert getattr(wire_input, "validate_batch") is validate.validate_batch  # noqa: B009
    assert set(stages) == {"checks", "decode", "poll_frame", "partial", "merge", "finalize",
                           "encode", "other", "whole"}
    assert all(stages[name] > 0 for name in stages if name != "other")
    parts = sum(s for name, s in stages.items() if name not in ("other", "whole"))
    assert abs(parts + stages["other"] - stages["whole"]) < 1e-9
    # the timed run still gives arrowagg's results
    spent: dict[str, float] = {}
    with stage_times.timed_stages(spent):
        timed = kernel.run_arrowagg(built, 2)
    kernel.check_agreement({"arrowagg": kernel.run_arrowagg(built, 2), "timed": timed})


def test_the_floors_stages_add_up() -> None:
    built = payloads.build(KernelCase("toy", 4, 500, 50, 2), "dictionary")
    stages = stage_times.floor_stages(built, 2)
    assert set(stages) == {"read", "group + merge", "encode", "whole"}
    assert stages["whole"] == sum(s for name, s in stages.items() if name != "whole")
