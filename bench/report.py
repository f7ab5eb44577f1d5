"""Results out: ``bench/results/*.json`` and ``docs/benchmarks.md``.

The page answers in the order a user asks: the machine, the whole job against the tools
one would use instead, reading the broker, the kernel, memory, latency, the scale-out
(with what one machine can and cannot show beside its table), the targets, and one link
to docs/benchmark-findings.md, where the method and the experiments behind every figure
are. Each section is there when its results are.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import report_peers, report_sections
from bench.machine import describe
from bench.merge_runs import holds
from bench.report_targets import targets
from bench.tables import markdown_table

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DOC = REPO / "docs" / "benchmarks.md"
PLOT_NAME = "benchmarks.png"
FINDINGS = "benchmark-findings.md"  # beside the page
SECTIONS = ("kernel", "e2e", "memory", "latency", "scale_out", "scale_out_containers")

Results = dict[str, Any]

INTRO = """\
arrowagg against the tools one would use instead, measured on one machine. Written by
`make bench` (`python -m bench`) from `bench/results/*.json`: do not edit by hand.
Ratios are the headline; absolute figures on a small shared machine are context."""
FINDINGS_LINK = f"""\
The method of every section, where each target stands and why, and the experiments
behind them: [the benchmark findings]({FINDINGS})."""


def write_json(results: Results, directory: Path = RESULTS) -> list[Path]:
    """One file per section plus ``all.json``; each is replaced, never appended to."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, body in [("all", results), *((k, results[k]) for k in SECTIONS if k in results)]:
        path = directory / f"{name}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(body, indent=1, default=str) + "\n")
        tmp.replace(path)
        written.append(path)
    return written


def markdown(results: Results, *, plot: bool) -> str:
    """The whole page."""
    parts = [
        "# Benchmarks", "", INTRO, "", "## The machine", "", "```", *_machine(results), "```", "",
    ]
    for heading, present, render in _SECTIONS:
        if present(results):
            parts += [heading, "", render(results), ""]
    parts += ["## Targets", "", markdown_table(
        ["target", "measured", "met"],
        [[t, m, "n/a" if ok is None else ("yes" if ok else "**no**")]
         for t, m, ok in targets(results)]), ""]
    if plot:
        parts += [f"![benchmark figures]({PLOT_NAME})", ""]
    parts += ["## How it is measured, and what the figures say", "", FINDINGS_LINK, ""]
    return "\n".join(parts)


def _machine(results: Results) -> list[str]:
    wall = results.get("wall_s")
    lines = [describe(results["machine"]),
             f"kafka: Apache Kafka {results.get('kafka', 'n/a')}, single local broker",
             f"run: {results.get('started', '')}, sizes {results.get('sizes', '')}"
             + (f", wall time {wall:.0f} s" if wall else ""), _load(results)]
    lines += [f"sections {', '.join(run['sections'])}: from the run of {run['started']} "
              f"({run['machine']})" for run in results.get("earlier", [])]
    return [line for line in lines if line]


def _load(results: Results) -> str:
    """The machine's 1-minute load average: other work on it is the noise in every figure."""
    load = results.get("load", {})
    if "start" not in load:
        return ""
    end = f", {load['end']:.1f} at the end" if "end" in load else ""
    return (f"load average (1 min): {load['start']:.1f} at the start{end}, "
            f"on {results['machine']['cores']} cores")


def _peers(results: Results) -> str:
    return "\n\n".join([report_peers.PEERS_INTRO, report_peers.peers_table(results),
                        "What makes each comparison uneven:",
                        report_peers.peers_uneven(results)])


def _memory(results: Results) -> str:
    parts = []
    if results.get("e2e", {}).get("peer_memory"):
        parts += ["### Per open group, end to end", report_peers.PEER_MEMORY_INTRO,
                  report_peers.peer_memory_table(results)]
    if "memory" in results:
        parts += ["### While streaming, the kernel path", report_sections.RSS_INTRO,
                  report_sections.memory_table(results)]
    return "\n\n".join(parts)


def _scale_out(results: Results) -> str:
    parts = []
    if "scale_out" in results:
        parts += [report_sections.scale_out_caveat(results),
                  report_sections.scale_out_table(results)]
    return "\n\n".join([*parts, "### In containers, each daemon capped in CPU",
                        report_sections.CONTAINERS_INTRO,
                        report_sections.containers_table(results)])


def _intro(text: str, table: Callable[[Results], str]) -> Callable[[Results], str]:
    return lambda results: f"{text}\n\n{table(results)}"


def _has(*path: str) -> Callable[[Results], bool]:
    return lambda results: holds(results, path)


_SECTIONS: list[tuple[str, Callable[[Results], bool], Callable[[Results], str]]] = [
    ("## Against the tools you would use instead", _has("e2e", "peers"), _peers),
    ("## Reading the broker: the daemon against a plain read", _has("e2e", "encodings"),
     _intro(report_sections.E2E_INTRO, report_sections.e2e_table)),
    ("## Aggregation kernel (no Kafka)", _has("kernel"),
     _intro(report_sections.KERNEL_INTRO, report_sections.kernel_table)),
    ("## Memory", lambda r: _has("memory")(r) or _has("e2e", "peer_memory")(r), _memory),
    ("## Latency: window close to readable result", _has("latency"),
     _intro(report_sections.LATENCY_INTRO, report_sections.latency_table)),
    ("## Scale-out: 1, 2 and 3 instances",
     lambda r: _has("scale_out")(r) or _has("scale_out_containers")(r), _scale_out),
]
