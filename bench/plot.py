"""The figure of docs/benchmarks.md (docs/benchmarks.png): kernel, end to end, memory
and latency, one panel each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.report import PEER_NAMES, gb


def draw(results: dict[str, Any], path: Path) -> None:
    import matplotlib as mpl  # noqa: PLC0415 - only make bench installs it

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    _plot_kernel(axes[0][0], results)
    _plot_e2e(axes[0][1], results)
    _plot_memory(axes[1][0], results)
    _plot_latency(axes[1][1], results)
    fig.suptitle(f"arrowagg vs peers, {results['machine']['cores']} cores "
                 f"({results.get('started', '')})")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _plot_kernel(ax: Any, results: dict[str, Any]) -> None:
    cases = results.get("kernel", [])
    peers = list(PEER_NAMES)
    width = 0.8 / len(peers)
    for i, peer in enumerate(peers):
        values = [c["peers"][peer]["rows_per_s"] / 1e6 if peer in c["peers"] else 0
                  for c in cases]
        ax.bar([x + i * width for x in range(len(cases))], values, width,
               label=PEER_NAMES[peer])
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(cases))],
                  [f"{c['case']}\n{c['encoding']}" for c in cases], fontsize=7)
    ax.set_ylabel("Mrows/s (median)")
    ax.set_title("1. aggregation kernel")
    ax.legend(fontsize=7)


def _plot_e2e(ax: Any, results: dict[str, Any]) -> None:
    labels, values = [], []
    for encoding, readers in results.get("e2e", {}).get("encodings", {}).items():
        for reader, fig in readers.items():
            labels.append(f"{reader}\n{encoding}")
            values.append(fig["rows_per_s"] / 1e6)
    for name, fig in results.get("e2e", {}).get("peers", {}).items():
        if "rows_per_s" in fig:
            labels.append(f"{name}\n(steady)")
            values.append(fig["rows_per_s"] / 1e6)
    ax.bar(range(len(values)), values, color="tab:green")
    ax.set_xticks(range(len(values)), labels, fontsize=6, rotation=25)
    ax.set_yscale("log")
    ax.set_ylabel("Mrows/s (log)")
    ax.set_title("2. end to end through the broker")


def _plot_memory(ax: Any, results: dict[str, Any]) -> None:
    memory = results.get("memory", {})
    for run in [*memory.get("fixed", []), *memory.get("sweep", [])]:
        samples = run.get("rss_samples_mb", [])
        ax.plot([at / 1e9 for at, _ in samples], [mb for _, mb in samples],
                label=f"{gb(run['bytes'])}, {run['groups']:,} groups")
    ax.set_xlabel("GB streamed")
    ax.set_ylabel("VmRSS MB")
    ax.set_title("3. RSS while streaming (kernel path)")
    ax.legend(fontsize=7)


def _plot_latency(ax: Any, results: dict[str, Any]) -> None:
    for name, run in results.get("latency", {}).items():
        if isinstance(run, dict) and run.get("latencies_ms"):
            values = sorted(run["latencies_ms"])
            ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=name)
    ax.axvline(250, color="grey", linestyle=":")
    ax.set_xlabel("window close -> readable, ms")
    ax.set_ylabel("fraction of windows")
    ax.set_title("4. latency (CDF)")
    ax.legend(fontsize=7)
