"""Results out: ``bench/results/*.json`` and ``docs/benchmarks.md`` with its plot."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import report_targets, running
from bench.machine import describe
from bench.memory import bytes_per_group
from bench.report_peers import (
    PEER_MEMORY_INTRO,
    PEERS_INTRO,
    peer_memory_table,
    peers_table,
    peers_uneven,
)
from bench.tables import markdown_table as _table

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DOC = REPO / "docs" / "benchmarks.md"
PLOT_NAME = "benchmarks.png"

PEER_NAMES = {"arrowagg": "arrowagg", "datafusion": "DataFusion", "duckdb": "DuckDB",
              "polars_naive": "naive Polars",
              **{name: f"Polars floor, {shape}"
                 for name, shape in report_targets.FLOOR_NAMES.items()}}


def write_json(results: dict[str, Any], directory: Path = RESULTS) -> list[Path]:
    """One file per section plus ``all.json``; each is replaced, never appended to."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, body in [("all", results), *((k, results[k]) for k in
                                           ("kernel", "e2e", "memory", "latency", "scale_out")
                                           if k in results)]:
        path = directory / f"{name}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(body, indent=1, default=str) + "\n")
        tmp.replace(path)
        written.append(path)
    return written


def scale_out_table(results: dict[str, Any]) -> str:
    figures = results["scale_out"]
    runs = figures["runs"]
    single = next((r for r in runs if r["mode"] == "one instance"), runs[0])
    rows = [[str(r["instances"]), r["mode"], f"{r['seconds']:.1f}",
             f"{r['rows_per_s']:,.0f}", f"{r['rows_per_s'] / single['rows_per_s']:.2f}x",
             f"{r['repartition_bytes'] / 1e6:.2f}" if r["repartition_bytes"] else "-",
             f"{r['repartition_bytes_per_input_gb'] / 1e6:.1f}" if r["repartition_bytes"]
             else "-"] for r in runs]
    head = (f"{figures['rows']:,} rows ({gb(figures['input_bytes'])}, dictionary keys, "
            f"{figures['groups']:,} groups, {figures['windows']} windows) in "
            f"{figures['input_partitions']} input partitions; "
            f"{figures['repartition_partitions']} repartition partitions. Launch to the last "
            "window whole on the output topic (every part's end-of-window marker).")
    return head + "\n\n" + _table(
        ["instances", "mode", "seconds", "rows/s", "vs one instance", "repartition MB",
         "repartition MB per input GB"], rows)


# -- the headline ------------------------------------------------------------------------


def targets(results: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """(target, what was measured, met) for every target the issue names."""
    rows = report_targets.kernel_rows(results)
    e2e = results.get("e2e", {})
    for encoding, readers in e2e.get("encodings", {}).items():
        ratio = readers["daemon"]["rows_per_s"] / _ceiling(readers)["rows_per_s"]
        rows.append((f"end to end >= 0.8x raw consume ({encoding})", f"{ratio:.2f}x",
                     ratio >= 0.8))
    rows += report_targets.reader_rows(results)
    if "peers" in e2e:
        rows.append(_quix_target(e2e["peers"]))
    memory = results.get("memory", {})
    if fixed := memory.get("fixed"):
        low, high = fixed[0], fixed[-1]
        change = high["steady_rss_mb"] / low["steady_rss_mb"] - 1
        peak = high["peak_rss_mb"] / low["peak_rss_mb"] - 1
        rows.append((f"RSS flat within 10% from {gb(low['bytes'])} to {gb(high['bytes'])}",
                     f"steady {change:+.1%}, peak {peak:+.1%}",
                     abs(change) <= 0.10 and abs(peak) <= 0.10))
    if (sweep := memory.get("sweep", [])) and len(sweep) > 1:
        low, high = sweep[0], sweep[-1]
        per_group = bytes_per_group(low["steady_rss_mb"], high["steady_rss_mb"],
                                    low["groups"], high["groups"])
        label = (f"steady RSS, {low['groups']:,} -> {high['groups']:,} groups, "
                 f"{gb(high['bytes'])} each")
        rows.append((f"memory per open group <= 300 bytes ({label})",
                     f"{per_group:.0f} bytes{report_targets.memory_anchors(results)}",
                     per_group <= 300))
    if defaults := results.get("latency", {}).get("defaults"):
        rows.append(("latency p99 < 250 ms (shipped defaults)",
                     f"p99 {defaults['p99_ms']:.0f} ms", defaults["p99_ms"] < 250))
    if tuned := results.get("latency", {}).get("tuned"):
        rows.append(("latency p99 < 250 ms (tuned, see below)",
                     f"p99 {tuned['p99_ms']:.0f} ms", tuned["p99_ms"] < 250))
    return rows


def _quix_target(peers: dict[str, Any]) -> tuple[str, str, bool | None]:
    target = "end to end >= 10x Quix Streams (steady rows/s, same slice shape)"
    ours, quix = peers.get("arrowagg", {}), peers.get("quix", {})
    for name, fig in (("arrowagg", ours), ("Quix", quix)):
        if "rows_per_s" not in fig:
            why = fig.get("skipped") or f"wrong output: {fig.get('wrong', 'not run')}"
            return target, f"{name}: {why}", None
    ratio = ours["rows_per_s"] / quix["rows_per_s"]
    return target, f"{ratio:.0f}x", ratio >= 10
def _ceiling(readers: dict[str, Any]) -> dict[str, Any]:
    raws = [v for k, v in readers.items() if k.startswith("raw")]
    return max(raws, key=lambda r: float(r["rows_per_s"]))


def _load(results: dict[str, Any]) -> str:
    """The machine's 1-minute load average: other work on it is the noise in every figure."""
    load = results.get("load", {})
    if "start" not in load:
        return ""
    end = f", {load['end']:.1f} at the end" if "end" in load else ""
    return (f"load average (1 min): {load['start']:.1f} at the start{end}, "
            f"on {results['machine']['cores']} cores")


def gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.0f} MB"


# -- markdown ----------------------------------------------------------------------------


def kernel_table(results: dict[str, Any]) -> str:
    rows = []
    for case in results.get("kernel", []):
        ours = case["peers"]["arrowagg"]["rows_per_s"]
        for peer, fig in case["peers"].items():
            rows.append([case["case"], case["encoding"], PEER_NAMES[peer],
                         f"{fig['median_s']:.3f}", f"{fig['rows_per_s'] / 1e6:.1f}",
                         f"{fig['mb_per_s']:.0f}", f"{ours / fig['rows_per_s']:.2f}x"])
    return _table(["case", "payload keys", "peer", "median s", "Mrows/s", "MB/s",
                   "arrowagg / peer"], rows)


def e2e_table(results: dict[str, Any]) -> str:
    e2e = results.get("e2e", {})
    rows = []
    for encoding, readers in e2e.get("encodings", {}).items():
        ceiling = _ceiling(readers)["rows_per_s"]
        for reader, fig in readers.items():
            rows.append([encoding, E2E_NAMES.get(reader, reader), gb(fig["bytes"]),
                         f"{fig['seconds']:.2f}", f"{fig['rows_per_s'] / 1e6:.2f}",
                         f"{fig['mb_per_s']:.0f}", f"{fig['rows_per_s'] / ceiling:.2f}x"])
    return _table(["payload keys", "reader", "input", "s", "Mrows/s", "MB/s",
                   "/ raw ceiling"], rows)


E2E_NAMES = {
    "daemon": "arrowagg daemon (shipped defaults)",
    "raw_daemon_batches": "raw consume, the daemon's take_batch(500, 0.2)",
    "raw_small_batches": "raw consume, consume(32, 0.2)",
    "overlapped": "floor: a reader thread prefetching for the daemon's pipeline, no transactions",
    "pipeline_alone": "floor: the daemon's pipeline on the same messages, no broker",
    "polars_reader": "floor: Polars at its best reading the broker (no validation, "
                     "grouped a poll at a time, output encoded, no transactions)",
}


def memory_table(results: dict[str, Any]) -> str:
    memory = results.get("memory", {})
    rows = []
    for kind, runs in (("fixed cardinality", memory.get("fixed", [])),
                       ("cardinality sweep", memory.get("sweep", []))):
        rows += [[kind, gb(run["bytes"]), f"{run['rows'] / 1e6:.0f} M", f"{run['groups']:,}",
                  f"{run['baseline_rss_mb']:.0f}", f"{run['steady_rss_mb']:.0f}",
                  f"{run['peak_rss_mb']:.0f}"] for run in runs]
    return _table(["run", "streamed", "rows", "groups per window", "RSS at start MB",
                   "steady RSS MB", "peak RSS MB"], rows)


def latency_table(results: dict[str, Any]) -> str:
    rows = []
    for name, run in results.get("latency", {}).items():
        if not isinstance(run, dict) or "windows" not in run:
            continue
        inside = run.get("close_to_commit_p50_ms")
        rows.append([LATENCY_NAMES.get(name, name), str(run["windows"]),
                     f"{run['p50_ms']:.0f}", f"{run['p99_ms']:.0f}", f"{run['max_ms']:.0f}",
                     "" if inside is None else f"{inside:.0f}"])
    return _table(["daemon settings", "windows", "p50 ms", "p99 ms", "max ms",
                   "close -> commit inside the daemon, p50 ms"], rows) + running.sentence(
        results.get("latency", {}).get("running"))


LATENCY_NAMES = {
    "defaults": "shipped defaults (poll_timeout_ms 200, fetch.wait.max.ms 100)",
    "tuned": "poll_timeout_ms 20, fetch.wait.max.ms 10",
}


def markdown(results: dict[str, Any], *, method: str, findings: str, plot: bool) -> str:
    wall = results.get("wall_s")
    parts = [
        "# Benchmarks",
        "",
        ("Written by `make bench` (`python -m bench`, the `bench/` package) on every run; "
         "do not edit by hand. Raw figures: `bench/results/*.json`."),
        "",
        "```",
        describe(results["machine"]),
        f"kafka: Apache Kafka {results.get('kafka', 'n/a')}, single local broker",
        f"run: {results.get('started', '')}, sizes {results.get('sizes', '')}, "
        f"wall time {wall:.0f} s" if wall else "",
        _load(results),
        *(f"sections {', '.join(run['sections'])}: from the run of {run['started']} "
          f"({run['machine']})" for run in results.get("earlier", [])),
        "```",
        "",
        "Ratios are the headline; absolute figures on a small shared machine are context.",
        "",
        "## Targets",
        "",
        _table(["target", "measured", "met"],
               [[t, m, "n/a" if ok is None else ("yes" if ok else "**no**")]
                for t, m, ok in targets(results)]),
        "",
    ]
    if plot:
        parts += [f"![benchmark figures]({PLOT_NAME})", ""]
    sections: list[tuple[str, Callable[[dict[str, Any]], str], str]] = [
        ("1. Aggregation kernel (no Kafka)", kernel_table, "kernel"),
        ("2. End to end through the broker", e2e_table, "e2e"),
        ("3. Memory while streaming", memory_table, "memory"),
        ("4. Latency: window close to readable result", latency_table, "latency"),
        ("5. Scale-out: 1, 2 and 3 instances", scale_out_table, "scale_out"),
    ]
    for title, render, key in sections:
        if key in results:
            parts += [f"## {title}", "", render(results), ""]
        if key == "e2e" and results.get("e2e", {}).get("peers"):
            parts += [PEERS_INTRO, "", peers_table(results), "",
                      "What makes each comparison uneven:", "", peers_uneven(results), ""]
        if key == "e2e" and results.get("e2e", {}).get("peer_memory"):
            parts += [PEER_MEMORY_INTRO, "", peer_memory_table(results), ""]
    parts += ["## How it is measured", "", method.strip(), "", "## What the profiles show", "",
              findings.strip(), ""]
    return "\n".join(parts)


# -- the plot ----------------------------------------------------------------------------
