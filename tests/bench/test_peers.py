"""The peers' harness without a broker: the order of the runs."""

from __future__ import annotations

from bench.peers import schedule
from bench.sizes import FULL, PeerRun


def test_arrowaggs_runs_are_spread_over_the_section() -> None:
    assert schedule(FULL.peers) == ["arrowagg", "quix", "bytewax", "bytewax_json",
                                    "arrowagg", "denormalized", "flink", "kstreams",
                                    "arrowagg"]
    assert schedule({"arrowagg": PeerRun(1, 2), "quix": PeerRun(1, 2)}) == [
        "arrowagg", "quix", "quix", "arrowagg"]


def test_a_single_arrowagg_run_comes_first() -> None:
    assert schedule({"quix": PeerRun(1), "arrowagg": PeerRun(1)}) == ["arrowagg", "quix"]


def test_without_arrowagg_the_others_keep_their_order() -> None:
    assert schedule({"quix": PeerRun(1, 2), "bytewax": PeerRun(1)}) == [
        "quix", "quix", "bytewax"]
    assert schedule({"arrowagg": PeerRun(1, 3)}) == ["arrowagg"] * 3
