"""The peers' part of ``docs/benchmarks.md``: the whole job per peer, what makes each
comparison uneven, and memory per open group end to end."""

from __future__ import annotations

from typing import Any

from bench.tables import markdown_table as _table

PEERS_INTRO = """### The whole job against the tools a user would pick instead

Each peer, written as a fluent user of it writes the job, drains its slice (20,000 rows
a 10-second window over 200 groups; one partition; a closing row per group) from a fresh
topic and writes its results to another, in a process of its own launched by the harness.
Every result is checked against DuckDB before any figure counts. *Startup*: launch to the
first input message in the peer's hands; *steady*: rows over first input to last result
(as the broker appended it; for arrowagg, the commit that made it readable); launch to
last result is both together, so on a short slice it is mostly startup. The steady ratio
is per row (the slices differ only in how many windows they hold); the launch-to-last one
compares the peer's whole run with arrowagg's startup plus the same rows at arrowagg's
steady rate: the same job from launch. *Machine load*: the 1-minute load average when the
(median) run started; arrowagg's runs are spread over the section, so its median sees the
same drift as the peers."""


def peers_table(results: dict[str, Any]) -> str:
    """The whole job per peer: startup apart from the steady rate, per-row ratios."""
    peers = results.get("e2e", {}).get("peers", {})
    ours = peers.get("arrowagg", {})
    rows = []
    for name, fig in peers.items():
        label = fig.get("label", name)
        if "skipped" in fig:
            rows.append([label, fig.get("input", ""), "", "", "", "", "", "",
                         f"skipped: {fig['skipped']}"])
        elif "wrong" in fig:
            rows.append([label, fig["input"], f"{fig['rows']:,}", "", "", "",
                         f"{fig['load']:.1f}", "", f"**wrong output**, not timed: {fig['wrong']}"])
        else:
            rows.append([label, fig["input"], f"{fig['rows']:,}", f"{fig['startup_s']:.2f}",
                         f"{fig['rows_per_s']:,.0f}", f"{fig['launch_to_last_rows_per_s']:,.0f}",
                         f"{fig['load']:.1f}", _steady_ratio(ours, fig),
                         _whole_job_ratio(ours, fig)])
    return _table(["peer", "input", "rows", "startup s", "steady rows/s",
                   "launch to last result, rows/s", "machine load",
                   "arrowagg / peer, steady", "arrowagg / peer, launch to last on its slice"],
                  rows)


def _steady_ratio(ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    if "rows_per_s" not in ours:
        return ""
    return f"{ours['rows_per_s'] / theirs['rows_per_s']:.1f}x"


def _whole_job_ratio(ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    """The peer's launch-to-last time over arrowagg's for the same number of rows: its
    startup plus those rows at its steady rate (the slices differ in length, and a
    launch-to-last rate depends on it)."""
    if "rows_per_s" not in ours:
        return ""
    ours_s = ours["startup_s"] + theirs["rows"] / ours["rows_per_s"]
    return f"{theirs['launch_to_last_s'] / ours_s:.1f}x"


def peers_uneven(results: dict[str, Any]) -> str:
    """What makes each comparison uneven, one line a peer."""
    peers = results.get("e2e", {}).get("peers", {})
    return "\n".join(f"- **{fig.get('label', name)}**: {fig['uneven']}"
                     for name, fig in peers.items() if "uneven" in fig)


PEER_MEMORY_INTRO = """#### Memory per open group, end to end

Each peer below runs the same whole job over a slice with every window holding the
given number of groups (one row a group and window at a million groups), its process
group's resident memory sampled every 0.2 s (PyFlink's JVM and its Python together), its
results checked against DuckDB. *Steady*: the median over the second half of the run
(first input to last result), as section 3 reads arrowagg's kernel path; *per open
group*: the steady difference between the two cardinalities over the groups between
them. Each keeps its state where it does by default (Flink: the heap state backend;
Kafka Streams: RocksDB, and suppress's buffer on the heap; the JVMs with their default
heap limits). arrowagg's daemon is run the same way, beside its section 3 figure."""


def peer_memory_table(results: dict[str, Any]) -> str:
    memory = results.get("e2e", {}).get("peer_memory", {})
    rows = []
    for name, fig in memory.items():
        label = fig.get("label", name)
        if "skipped" in fig:
            rows.append([label, "", "", "", "", "", f"skipped: {fig['skipped']}"])
            continue
        rows += [[label, f"{run['groups']:,}", f"{run['rows']:,}", *_rss(run),
                  _per_group(fig) if run is fig["runs"][-1] else ""] for run in fig["runs"]]
    if section_3 := results.get("memory", {}).get("sweep"):
        low, high = section_3[0], section_3[-1]
        rows.append(["arrowagg kernel path (section 3)", f"{high['groups']:,}",
                     f"{high['rows']:,}", f"{high['steady_rss_mb']:,.0f}",
                     f"{high['peak_rss_mb']:,.0f}", "", f"{_section_3_bytes(low, high):,.0f}"])
    return _table(["peer", "groups a window", "rows", "steady RSS MB", "peak RSS MB",
                   "steady rows/s", "bytes per open group"], rows)


def _rss(run: dict[str, Any]) -> list[str]:
    if "wrong" in run:
        return ["", "", ""]
    return [f"{run['steady_rss_mb']:,.0f}", f"{run['peak_rss_mb']:,.0f}",
            f"{run['rows_per_s']:,.0f}"]


def _per_group(fig: dict[str, Any]) -> str:
    if "wrong" in fig:
        return f"**wrong output**: {fig['wrong']}"
    return f"{fig['bytes_per_group']:,.0f}"


def _section_3_bytes(low: dict[str, Any], high: dict[str, Any]) -> float:
    from bench.memory import bytes_per_group  # noqa: PLC0415 - polars loads slowly

    return bytes_per_group(low["steady_rss_mb"], high["steady_rss_mb"], low["groups"],
                           high["groups"])
