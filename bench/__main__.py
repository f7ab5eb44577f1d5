"""``python -m bench`` (``make bench``): run the sections, print and write the results;
``--render-only`` writes docs/benchmarks.md again from the results already there."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from bench import (
    e2e,
    jvm_peers,
    kernel_floor,
    latency,
    memory,
    merge_runs,
    payloads,
    peer_memory,
    peers,
    report,
    running,
    scale_out,
    scale_out_containers,
)
from bench.broker import broker, delete_topics, kafka_version
from bench.machine import describe, machine_info
from bench.plot import draw
from bench.report_sections import PEER_NAMES
from bench.report_targets import targets
from bench.sizes import FULL, SMOKE, Sizes

SECTIONS = ("kernel", "e2e", "peers", "memory", "latency", "scale_out",
            "scale_out_containers")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.render_only:
        stored = json.loads((Path(args.results) / "all.json").read_text())
        write_page(stored, Path(args.doc), plot=not args.no_plot)
        return 0
    sizes = SMOKE if args.smoke else FULL
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    started = time.monotonic()
    info = machine_info({p.package: p.python() for p in peers.PEERS if p.package})
    info["versions"]["kafka-streams"] = jvm_peers.kstreams_version()
    info["versions"]["java"] = jvm_peers.java_version()
    print(describe(info), flush=True)
    results: dict[str, Any] = {
        "machine": info, "sizes": "smoke" if args.smoke else "full",
        "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load": {"start": os.getloadavg()[0]},
    }
    if "kernel" in sections:
        results["kernel"] = run_kernel(sizes)
    if "memory" in sections:
        results["memory"] = run_memory(sizes)
    if {"e2e", "peers", "latency", "scale_out", "scale_out_containers"} & set(sections):
        with broker() as bootstrap:
            results["kafka"] = kafka_version(bootstrap)
            if "e2e" in sections:
                results["e2e"] = run_e2e(bootstrap, sizes)
            if "peers" in sections:
                results.setdefault("e2e", {}).update(run_peers(bootstrap, sizes, args.peers))
            if "latency" in sections:
                results["latency"] = run_latency(bootstrap, sizes)
            if "scale_out" in sections:
                results["scale_out"] = run_scale_out(bootstrap, sizes)
            if "scale_out_containers" in sections:
                results["scale_out_containers"] = run_scale_out_containers(
                    bootstrap, sizes, smoke=args.smoke)
    results["wall_s"] = time.monotonic() - started
    results["load"]["end"] = os.getloadavg()[0]
    if args.update:
        results = merge_runs.merged(Path(args.results) / "all.json", results, sections)
    write_outputs(results, Path(args.results), Path(args.doc), plot=not args.no_plot)
    print(f"wall time {results['wall_s']:.0f} s", flush=True)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (the smoke test)")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument("--results", default=str(report.RESULTS), help="JSON directory")
    parser.add_argument("--doc", default=str(report.DOC), help="the markdown to write")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG (no matplotlib)")
    parser.add_argument("--peers", help="only these peers in the peers section "
                        f"(comma-separated: {','.join(peers.BY_NAME)})")
    parser.add_argument("--update", action="store_true",
                        help="keep the sections not run from the results already there")
    parser.add_argument("--render-only", action="store_true",
                        help="run nothing: write the page (and plot) from RESULTS/all.json")
    return parser


def _step(what: str) -> None:
    print(f"-- {what}", flush=True)


def run_kernel(sizes: Sizes) -> list[dict[str, Any]]:
    cases = []
    for case in sizes.kernel_cases:
        for encoding in payloads.ENCODINGS:
            _step(f"kernel: {case.name}, {encoding} keys")
            built = payloads.build(case, encoding)
            figures = kernel_floor.measure(built, repetitions=case.repetitions,
                                           poll_messages=sizes.poll_messages)
            cases.append(figures)
            ours = figures["peers"]["arrowagg"]["rows_per_s"]
            print("   " + ", ".join(
                f"{PEER_NAMES[p]} {f['rows_per_s'] / 1e6:.1f} Mrows/s "
                f"({ours / f['rows_per_s']:.2f}x)" for p, f in figures["peers"].items()),
                flush=True)
    return cases


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    middle = statistics.median_low([r["seconds"] for r in runs])
    chosen = next(r for r in runs if r["seconds"] == middle)
    return {**chosen, "runs_s": [r["seconds"] for r in runs]}


def run_e2e(bootstrap: str, sizes: Sizes) -> dict[str, Any]:
    encodings: dict[str, Any] = {}
    for encoding in payloads.ENCODINGS:
        _step(f"e2e: filling a {sizes.e2e_partitions}-partition topic, {encoding} keys")
        topic = e2e.prepare(bootstrap, encoding, sizes.e2e_bytes, sizes.e2e_partitions)
        readers: dict[str, Callable[[], dict[str, Any]]] = {
            "raw_daemon_batches": partial(e2e.run_raw, bootstrap, topic, batch=500,
                                          like_daemon=True),
            "raw_small_batches": partial(e2e.run_raw, bootstrap, topic, batch=32),
            "daemon": partial(e2e.run_daemon, bootstrap, topic),
            "overlapped": partial(e2e.run_overlapped, bootstrap, topic),
            "pipeline_alone": partial(e2e.run_pipeline_alone, topic),
            "polars_reader": partial(e2e.run_polars_reader, bootstrap, topic),
        }
        figures = {}
        for name, run in readers.items():
            figures[name] = _median_run([run() for _ in range(sizes.e2e_repetitions)])
            print(f"   {name}: {figures[name]['seconds']:.2f} s, "
                  f"{figures[name]['mb_per_s']:.0f} MB/s", flush=True)
        encodings[encoding] = figures
        delete_topics(bootstrap, [topic.name])
    return {"encodings": encodings}


def run_peers(bootstrap: str, sizes: Sizes, chosen: str | None = None) -> dict[str, Any]:
    """The whole job per peer, then memory per open group for some of them; ``chosen``:
    only these (comma-separated names)."""
    if chosen:
        names = chosen.split(",")
        sizes = replace(sizes, peers={n: r for n, r in sizes.peers.items() if n in names},
                        peer_memory_peers=tuple(n for n in sizes.peer_memory_peers
                                                if n in names))
    figures = peers.run_all(bootstrap, sizes.peers, _step)
    ours = figures.get("arrowagg", {}).get("rows_per_s")
    for name, fig in figures.items():
        if "skipped" in fig or "wrong" in fig:
            print(f"   {name}: {fig.get('skipped') or 'WRONG: ' + fig['wrong']}", flush=True)
            continue
        ratio = (f", arrowagg = {ours / fig['rows_per_s']:.1f}x"
                 if ours and name != "arrowagg" else "")
        print(f"   {name}: startup {fig['startup_s']:.2f} s, steady "
              f"{fig['rows_per_s']:,.0f} rows/s{ratio}", flush=True)
    memory = peer_memory.run_all(bootstrap, sizes, _step)
    for name, fig in memory.items():
        what = fig.get("skipped") or fig.get("wrong") or (
            f"{fig['bytes_per_group']:,.0f} bytes an open group (steady RSS "
            + ", ".join(f"{r['steady_rss_mb']:,.0f} MB at {r['groups']:,} groups"
                        for r in fig["runs"]) + ")")
        print(f"   memory, {name}: {what}", flush=True)
    return {"peers": figures, "peer_memory": memory}


def run_memory(sizes: Sizes) -> dict[str, Any]:
    fixed_groups = sizes.memory_groups[0]
    fixed, sweep = [], []
    for nbytes in sizes.memory_bytes:
        _step(f"memory: {nbytes / 1e9:.2f} GB at {fixed_groups:,} groups")
        fixed.append(memory.measure(nbytes, fixed_groups, sizes.poll_messages))
        print(f"   steady {fixed[-1]['steady_rss_mb']:.0f} MB, "
              f"peak {fixed[-1]['peak_rss_mb']:.0f} MB", flush=True)
    nbytes, repetitions = sizes.memory_sweep_bytes, sizes.memory_sweep_repetitions
    for groups in sizes.memory_groups:
        _step(f"memory: {nbytes / 1e9:.2f} GB at {groups:,} groups, {repetitions} times")
        runs = [memory.measure(nbytes, groups, sizes.poll_messages)
                for _ in range(repetitions)]
        steady = sorted(run["steady_rss_mb"] for run in runs)
        median = next(run for run in runs if run["steady_rss_mb"] == steady[len(runs) // 2])
        sweep.append({**median, "steady_rss_mb_runs": steady})
        print(f"   steady {', '.join(f'{mb:.0f}' for mb in steady)} MB, "
              f"peak {median['peak_rss_mb']:.0f} MB (median run)", flush=True)
    return {"fixed": fixed, "sweep": sweep}


def run_scale_out(bootstrap: str, sizes: Sizes) -> dict[str, Any]:
    _step(f"scale-out: {sizes.scale_out_bytes / 1e6:.0f} MB through 1, 2, 3 instances")
    figures = scale_out.measure(bootstrap, target_bytes=sizes.scale_out_bytes,
                                runs_of=sizes.scale_out_runs,
                                repeats=sizes.scale_out_repeats, step=_step)
    for run in figures["runs"]:
        print(f"   {run['job']}, {run['instances']} instance(s), {run['mode']}: "
              f"{run['seconds']:.1f} s, "
              f"{run['rows_per_s']:,.0f} rows/s, repartition "
              f"{run['repartition_bytes_per_input_gb'] / 1e6:.1f} MB per input GB", flush=True)
    return figures


def run_scale_out_containers(bootstrap: str, sizes: Sizes, *, smoke: bool) -> dict[str, Any]:
    # The smoke run (make test) builds no image: a cold engine takes minutes.
    figures: dict[str, Any] = {"skipped": "smoke sizes build no container image"}
    if not smoke:
        figures = scale_out_containers.measure(
            bootstrap, scale_out_containers.broker_pid(), target_bytes=sizes.scale_out_bytes,
            step=_step)
    if "skipped" in figures:
        print(f"   skipped: {figures['skipped']}", flush=True)
    for run in figures.get("runs", []):
        print(f"   {run['instances']} container(s): {run['seconds']:.1f} s, "
              f"{run['rows_per_s']:,.0f} rows/s", flush=True)
    return figures


def run_latency(bootstrap: str, sizes: Sizes) -> dict[str, Any]:
    runs = {}
    for name, processing, consumer in (
        ("defaults", {}, {}),
        ("tuned", {"poll_timeout_ms": 20}, {"fetch.wait.max.ms": 10}),
    ):
        _step(f"latency: {sizes.latency_s:.0f} s at {sizes.latency_messages_per_s} msg/s, "
              f"{name}")
        runs[name] = latency.measure(
            bootstrap, seconds=sizes.latency_s, window_ms=sizes.latency_window_ms,
            messages_per_s=sizes.latency_messages_per_s,
            rows_per_message=sizes.latency_rows_per_message,
            processing=processing, consumer=consumer)
        print(f"   p50 {runs[name]['p50_ms']:.0f} ms, p99 {runs[name]['p99_ms']:.0f} ms",
              flush=True)
    window_ms = 10 * sizes.latency_window_ms
    _step(f"latency: early results every {sizes.latency_window_ms} ms on {window_ms} ms "
          "windows, the running value's age")
    runs["running"] = running.measure(
        bootstrap, seconds=sizes.latency_s, window_ms=window_ms,
        emit_every_ms=sizes.latency_window_ms, messages_per_s=sizes.latency_messages_per_s,
        rows_per_message=sizes.latency_rows_per_message)
    print(f"   p50 {runs['running']['p50_ms']:.0f} ms, p99 {runs['running']['p99_ms']:.0f} ms",
          flush=True)
    return runs


def write_outputs(results: dict[str, Any], directory: Path, doc: Path, *, plot: bool) -> None:
    for path in report.write_json(results, directory):
        print(f"wrote {path.name}", flush=True)
    write_page(results, doc, plot=plot)


def write_page(results: dict[str, Any], doc: Path, *, plot: bool) -> None:
    """docs/benchmarks.md (and its plot beside it) from ``results``; the targets printed."""
    doc.parent.mkdir(parents=True, exist_ok=True)
    if plot:
        draw(results, doc.parent / report.PLOT_NAME)
    doc.write_text(report.markdown(results, plot=plot))
    print(f"wrote {doc}", flush=True)
    for target, measured, met in targets(results):
        verdict = "n/a" if met is None else ("met" if met else "NOT met")
        print(f"target: {target}: {measured} ({verdict})", flush=True)


if __name__ == "__main__":
    sys.exit(main())
