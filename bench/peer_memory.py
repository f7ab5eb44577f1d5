"""Memory per open group, end to end: arrowagg beside the JVM peers, each as it runs.

``bench.memory`` reads arrowagg's kernel path in a process of its own; here each peer
(arrowagg's daemon too, for a like-for-like anchor) runs the whole job as in the peers
section (``bench.peers.measure``: its own process group, a fresh one-partition topic,
results checked against DuckDB) over a slice with ``groups`` groups in every window, and
the group's RSS (PyFlink's JVM and its Python together) is sampled every 0.2 s. The
steady RSS is the median over the second half of the run (first input to last result),
as ``bench.memory`` reads it; an open group costs the steady difference between the low
and the high cardinality over the groups between them. Each peer keeps its state where
it does by default: Flink in its heap state backend, Kafka Streams in RocksDB with
suppress's buffer on the heap, the JVMs with their default heap limits.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from bench import peer_data, peers
from bench.memory import bytes_per_group
from bench.payloads import Payloads, build
from bench.process_rss import RssSampler
from bench.sizes import KernelCase, Sizes


def slice_payloads(groups: int, windows: int, rows_per_window: int) -> Payloads:
    """``windows`` windows of ``rows_per_window`` rows over ``groups`` groups each, in
    Arrow messages of the peers' slice (at most 10,000 rows; JSON: a row a message)."""
    per_message = min(peer_data.ROWS_PER_MESSAGE, rows_per_window)
    if rows_per_window % per_message or rows_per_window < groups:
        raise ValueError(f"{rows_per_window:,} rows a window: not whole messages of "
                         f"{per_message:,} rows, or fewer than the {groups:,} groups")
    case = KernelCase(f"{groups:,} groups", windows * rows_per_window // per_message,
                      per_message, groups, rows_per_window // per_message)
    return build(case, "plain")


def measure(bootstrap: str, peer: peers.Peer, payloads: Payloads) -> dict[str, Any]:
    """One checked run of ``peer`` over ``payloads`` with its RSS sampled."""
    samplers: list[RssSampler] = []

    def sample(pid: int) -> None:
        samplers.append(RssSampler(pid))
        samplers[0].start()

    figures = peers.measure(bootstrap, peer, payloads, peer_data.reference(payloads),
                            on_start=sample)
    samples = samplers[0].stop() if samplers else []
    result = {"groups": payloads.case.groups, "rows": payloads.rows,
              "windows": payloads.windows, "load": figures["load"]}
    if "rows_per_s" not in figures:
        return {**result, "wrong": figures.get("wrong", "not timed")}
    first = figures["launched"] + figures["startup_s"]
    return {**result, **steady_rss(samples, first, first + figures["steady_s"]),
            "rows_per_s": figures["rows_per_s"]}


def steady_rss(samples: list[tuple[float, int]], first: float, last: float,
               ) -> dict[str, float]:
    """The median RSS (MiB) over the second half of [first, last] (a run shorter than
    two samples: the last sample before its end), and the peak up to ``last``."""
    middle = (first + last) / 2
    before = [(at, kb) for at, kb in samples if at <= last]
    if not before:
        raise ValueError("no RSS sample before the run's last result")
    late = [kb for at, kb in before if at >= middle] or [before[-1][1]]
    return {"steady_rss_mb": statistics.median(late) / 1024,
            "peak_rss_mb": max(kb for _, kb in before) / 1024}


def run_all(bootstrap: str, sizes: Sizes, step: Callable[[str], None] = lambda _what: None,
            ) -> dict[str, Any]:
    """Every peer of ``sizes.peer_memory_peers`` at each cardinality, and its bytes per
    open group; a peer that cannot run here is skipped with the reason."""
    figures: dict[str, Any] = {}
    windows, rows_per_window = sizes.peer_memory_windows, sizes.peer_memory_rows_per_window
    for name in sizes.peer_memory_peers:
        peer = peers.BY_NAME[name]
        if (why := peer.missing()) is not None:
            figures[name] = {"label": peer.label, "skipped": why}
            continue
        runs = []
        for count in sizes.peer_memory_groups:
            step(f"peer memory: {peer.label}, {count:,} groups a window, {windows} windows")
            runs.append(measure(bootstrap, peer, slice_payloads(count, windows,
                                                                rows_per_window)))
        figures[name] = {"label": peer.label, "runs": runs, **per_group(runs)}
    return figures


def per_group(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Bytes an extra open group costs between the lowest and highest cardinality."""
    wrong = [run for run in runs if "wrong" in run]
    if wrong:
        return {"wrong": wrong[0]["wrong"]}
    low, high = runs[0], runs[-1]
    return {"bytes_per_group": bytes_per_group(low["steady_rss_mb"], high["steady_rss_mb"],
                                               low["groups"], high["groups"])}
