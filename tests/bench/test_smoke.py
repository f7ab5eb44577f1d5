"""The benchmark harness at toy sizes, so ``make bench`` cannot rot between runs.

The end-to-end peers other than arrowagg (Quix Streams, Bytewax, Denormalized, Flink SQL,
Kafka Streams) are left out: each needs an interpreter or a JVM build of its own, which
only ``make bench`` installs; arrowagg runs the peers' path (its own process, the output
checked against DuckDB), and the memory-per-group runs of that path. The plot needs
matplotlib, also a bench-only dependency, so the smoke run writes the tables without it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import __main__ as harness
from bench import kernel, kernel_floor, payloads
from bench.sizes import SMOKE, KernelCase


def test_every_kernel_peer_agrees_and_is_timed() -> None:
    built = payloads.build(KernelCase("toy", 4, 500, 50, 2), "plain")
    figures = kernel.measure(built, repetitions=1, poll_messages=2)
    assert set(figures["peers"]) == set(kernel.PEERS)
    assert all(f["rows_per_s"] > 0 for f in figures["peers"].values())


def test_the_polars_floor_is_timed_with_the_peers() -> None:
    built = payloads.build(KernelCase("toy", 4, 500, 50, 2), "dictionary")
    figures = kernel_floor.measure(built, repetitions=1, poll_messages=2)
    assert set(figures["peers"]) == {*kernel.PEERS, *kernel_floor.SHAPES}
    assert all(f["rows_per_s"] > 0 for f in figures["peers"].values())


def test_the_seed_sql_follows_the_seed_rules() -> None:
    schema = payloads.build(KernelCase("toy", 1, 10, 5, 1), "dictionary").values[0]
    sql = kernel.seed_sql(kernel.schema_of(schema), "t", "W")
    assert 'SUM("reading_sum")' in sql
    assert 'SUM("reading_count")' in sql
    assert 'MIN("reading_min")' in sql
    assert 'MAX("reading_max")' in sql
    assert 'SUM("power")' in sql
    assert sql.endswith("GROUP BY 1, 2, 3")


@pytest.mark.integration
def test_the_harness_writes_figures_for_every_peer(
    bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", bootstrap)
    doc = tmp_path / "docs" / "benchmarks.md"
    assert harness.main(["--smoke", "--no-plot", "--results", str(tmp_path / "results"),
                         "--doc", str(doc)]) == 0
    results = json.loads((tmp_path / "results" / "all.json").read_text())
    assert results["sizes"] == "smoke"
    assert {"cores", "memory_gb", "versions"} <= set(results["machine"])
    for case in results["kernel"]:
        assert set(case["peers"]) == {*kernel.PEERS, *kernel_floor.SHAPES}
    assert len(results["kernel"]) == len(SMOKE.kernel_cases) * len(payloads.ENCODINGS)
    for readers in results["e2e"]["encodings"].values():
        assert {"daemon", "raw_daemon_batches", "raw_small_batches", "overlapped",
                "pipeline_alone", "polars_reader"} <= set(readers)
        assert all(r["rows_per_s"] > 0 for r in readers.values())
    peers = results["e2e"]["peers"]
    ours = peers["arrowagg"]
    assert "wrong" not in ours
    assert ours["results"] == ours["windows"] * 200
    assert 0 < ours["startup_s"] < ours["launch_to_last_s"]
    assert ours["rows_per_s"] > ours["launch_to_last_rows_per_s"] > 0
    assert set(peers) == set(SMOKE.peers)
    assert all("skipped" in peers[name] for name in peers if name != "arrowagg")
    [(name, memory)] = results["e2e"]["peer_memory"].items()  # arrowagg's, checked right
    assert name == "arrowagg"
    assert [run["groups"] for run in memory["runs"]] == list(SMOKE.peer_memory_groups)
    assert all(run["steady_rss_mb"] > 0 for run in memory["runs"])
    assert "bytes_per_group" in memory
    assert len(results["memory"]["fixed"]) == len(SMOKE.memory_bytes)
    assert all(r["peak_rss_mb"] > 0 for r in results["memory"]["fixed"])
    sweep = results["memory"]["sweep"]
    assert [r["groups"] for r in sweep] == list(SMOKE.memory_groups)
    assert all(r["bytes"] >= SMOKE.memory_sweep_bytes for r in sweep)
    running = results["latency"].pop("running")
    assert running["provisional_messages"] > 0
    assert running["p99_ms"] >= running["p50_ms"] > 0
    for run in results["latency"].values():
        assert run["windows"] > 0
        assert run["p99_ms"] >= run["p50_ms"] > 0
    runs = results["scale_out"]["runs"]
    assert [(r["job"], r["instances"], r["mode"]) for r in runs] == [
        (job, n, mode) for job in ("decomposable", "holistic", "session", "session holistic")
        for n, mode in ((1, "one instance"), (2, "two stages"))]  # SMOKE.scale_out_runs
    assert all(r["rows_per_s"] > 0 for r in runs)
    assert all((r["repartition_bytes"] > 0) == (r["mode"] == "two stages") for r in runs)
    sessions = results["scale_out"]["sessions"]
    assert sessions > results["scale_out"]["groups"]  # the gap cuts: many a group
    assert [r.get("sessions") for r in runs] == [
        sessions if r["job"].startswith("session") else None for r in runs]
    text = doc.read_text()
    assert len(text.splitlines()) <= 200
    for said in ("## Against the tools you would use instead", "## Reading the broker",
                 "## Aggregation kernel", "### Per open group, end to end",
                 "### While streaming", "## Latency", "Early results (`window.emit_every_ms:",
                 "## Scale-out", "| session holistic | 2 | two stages |",
                 "### In containers", "## Targets",
                 "kernel within 1.15x the Polars floor's time"):
        assert said in text
