"""``bench.research.scale_out_cost``: the line fit, and a smoke run through the broker."""

from __future__ import annotations

import pytest

from bench.research import scale_out_cost


def test_the_fit_splits_a_fixed_cost_from_a_cost_per_row() -> None:
    fixed, rate = scale_out_cost.fit([(1_000_000, 1.5), (3_000_000, 2.5)])
    assert fixed == pytest.approx(1.0)
    assert rate == pytest.approx(2_000_000)


def test_a_smoke_run_prints_both_modes_and_the_cadence_repeat(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert scale_out_cost.main(["--smoke"]) == 0
    out = capsys.readouterr().out
    assert "one instance" in out
    assert "two stages" in out
    assert "commit interval 100 ms, largest size: one instance" in out
