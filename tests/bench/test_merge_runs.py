"""``--update``: a run's sections merged into an earlier run's results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.merge_runs import merged

MACHINE = {"cores": 2, "memory_gb": 8.0, "cpu": "cpu A", "python": "3.11",
           "versions": {"polars": "1"}}


def earlier_run() -> dict[str, Any]:
    return {"started": "day 1", "machine": MACHINE, "kernel": ["k1"],
            "e2e": {"encodings": {"plain": "readers 1"}, "peers": {"quix": "q1"},
                    "peer_memory": {"flink": "f1"}},
            "memory": {"sweep": "m1"}}


def test_the_sections_not_run_are_kept_and_said_to_be_older(tmp_path: Path) -> None:
    previous = tmp_path / "all.json"
    previous.write_text(json.dumps(earlier_run()))
    new = {"started": "day 2", "machine": MACHINE,
           "e2e": {"peers": {"quix": "q2"}, "peer_memory": {"flink": "f2"}}}
    out = merged(previous, new, ["peers"])
    assert out["e2e"] == {"peers": {"quix": "q2"}, "peer_memory": {"flink": "f2"},
                          "encodings": {"plain": "readers 1"}}
    assert out["kernel"] == ["k1"]
    assert out["memory"] == {"sweep": "m1"}
    assert out["started"] == "day 2"
    assert out["earlier"] == [{"sections": ["kernel", "e2e", "memory"], "started": "day 1",
                               "machine": "machine: 2 cores, 8.0 GB, cpu A; Python 3.11"}]


def test_a_third_run_keeps_each_sections_own_origin(tmp_path: Path) -> None:
    previous = tmp_path / "all.json"
    previous.write_text(json.dumps(earlier_run()))
    second = merged(previous, {"started": "day 2", "machine": MACHINE,
                               "kernel": ["k2"]}, ["kernel"])
    previous.write_text(json.dumps(second))
    third = merged(previous, {"started": "day 3", "machine": MACHINE,
                              "memory": {"sweep": "m3"}}, ["memory"])
    assert third["kernel"] == ["k2"]
    assert third["memory"] == {"sweep": "m3"}
    assert [(run["sections"], run["started"]) for run in third["earlier"]] == [
        (["e2e", "peers"], "day 1"), (["kernel"], "day 2")]


def test_without_earlier_results_the_run_stands_alone(tmp_path: Path) -> None:
    new = {"started": "day 2", "kernel": ["k2"]}
    assert merged(tmp_path / "absent.json", new, ["kernel"]) == new


def test_a_rerun_of_one_peer_keeps_the_others(tmp_path: Path) -> None:
    previous = tmp_path / "all.json"
    previous.write_text(json.dumps(earlier_run()))
    new = {"started": "day 2", "machine": MACHINE,
           "e2e": {"peers": {"flink": "f2"}, "peer_memory": {"flink": "fm2"}}}
    out = merged(previous, new, ["peers"])
    assert out["e2e"]["peers"] == {"quix": "q1", "flink": "f2"}
    assert out["e2e"]["peer_memory"] == {"flink": "fm2"}
