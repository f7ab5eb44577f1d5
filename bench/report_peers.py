"""The peers' part of ``docs/benchmarks.md``: the whole job per peer, what makes each
comparison uneven, and memory per open group end to end."""

from __future__ import annotations

from typing import Any

from bench.tables import markdown_table as _table

PEERS_INTRO = """\
Each peer, written as a fluent user of it writes the job, drains its slice (20,000 rows
a 10-second window over 200 groups, one partition) from a fresh topic into another, in a
process of its own; every result is checked against DuckDB before any figure counts.
*Startup*: launch to the first input in the peer's hands; *steady*: rows over first
input to last result. The steady ratio is per row; the launch-to-last one sets the
peer's whole run against arrowagg's startup plus the same rows at its steady rate.
*Machine load*: the 1-minute load average when the run started."""


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


PEER_MEMORY_INTRO = """\
The same whole job over two windows of a million rows, with 10,000 and then 1,000,000
groups in each; the process group's RSS sampled every 0.2 s. An open group costs the
steady difference (the median over the second half) over the groups between. Each peer
keeps its state where it does by default (Flink: the heap; Kafka Streams: RocksDB)."""


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
    if kernel_path := results.get("memory", {}).get("sweep"):
        low, high = kernel_path[0], kernel_path[-1]
        rows.append(["arrowagg kernel path (below)", f"{high['groups']:,}",
                     f"{high['rows']:,}", f"{high['steady_rss_mb']:,.0f}",
                     f"{high['peak_rss_mb']:,.0f}", "", f"{_kernel_path_bytes(low, high):,.0f}"])
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


def _kernel_path_bytes(low: dict[str, Any], high: dict[str, Any]) -> float:
    from bench.memory import bytes_per_group  # noqa: PLC0415 - polars loads slowly

    return bytes_per_group(low["steady_rss_mb"], high["steady_rss_mb"], low["groups"],
                           high["groups"])
