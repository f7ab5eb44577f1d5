"""The measured sections of ``docs/benchmarks.md`` after the peers: the end-to-end
readers, the kernel, memory, latency and the scale-out (one instance's process and
capped containers). Each gives a few lines of what was measured and one table; how it
is measured in full is in docs/benchmark-findings.md."""

from __future__ import annotations

from typing import Any

from bench import kernel_floor, running
from bench.tables import gb, markdown_table

PEER_NAMES = {"arrowagg": "arrowagg", "datafusion": "DataFusion", "duckdb": "DuckDB",
              "polars_naive": "naive Polars",
              **{name: f"Polars floor, {shape}"
                 for name, shape in kernel_floor.NAMES.items()}}
_KERNEL_PEERS = ("datafusion", "duckdb", "polars_naive")


def raw_ceiling(readers: dict[str, Any]) -> dict[str, Any]:
    """The faster of the raw consumers: what reading the topic alone takes."""
    raws = [v for k, v in readers.items() if k.startswith("raw")]
    return max(raws, key=lambda r: float(r["rows_per_s"]))


def _ratio(ours: float, theirs: float) -> str:
    return f"{theirs / 1e6:.1f} ({ours / theirs:.2f}x)"


E2E_INTRO = """\
The daemon (shipped defaults, exactly-once) drains a pre-filled 4-partition topic;
beside it, what any reader of that topic takes: a raw consumer that only reads (the
ceiling) and the floors (Polars at its best reading the broker; the daemon's own
pipeline with no broker; a prefetching loop around it). Mrows/s (share of the ceiling)."""

_E2E_COLUMNS = {"daemon": "arrowagg daemon", "polars_reader": "Polars reader (floor)",
                "pipeline_alone": "the daemon's pipeline, no broker",
                "overlapped": "prefetching loop, no transactions"}


def e2e_table(results: dict[str, Any]) -> str:
    encodings = results.get("e2e", {}).get("encodings", {})
    rows = []
    for encoding, readers in encodings.items():
        ceiling = raw_ceiling(readers)
        rows.append([encoding, gb(ceiling["bytes"]), f"{ceiling['rows_per_s'] / 1e6:.1f}",
                     *(f"{readers[k]['rows_per_s'] / 1e6:.1f} "
                       f"({readers[k]['rows_per_s'] / ceiling['rows_per_s']:.2f}x)"
                       if k in readers else "" for k in _E2E_COLUMNS)])
    return markdown_table(["payload keys", "input", "raw read (ceiling)",
                           *_E2E_COLUMNS.values()], rows)


KERNEL_INTRO = """\
The same pre-encoded messages through arrowagg's own pipeline (decode with full
validation, window, aggregate, close, encode the output; no broker), DataFusion and
DuckDB (the seed's SQL over the decoded batches), naive Polars, and the Polars floor:
the fastest of Polars doing arrowagg's whole job (no validation; timed in the same run).
Every result is checked against arrowagg's first. Mrows/s (arrowagg / peer)."""


def kernel_table(results: dict[str, Any]) -> str:
    rows = []
    for case in results.get("kernel", []):
        peers = case["peers"]
        ours = peers["arrowagg"]["rows_per_s"]
        rows.append([case["case"], case["encoding"], f"{ours / 1e6:.1f}",
                     *(_ratio(ours, peers[p]["rows_per_s"]) if p in peers else ""
                       for p in _KERNEL_PEERS), _floor_cell(case)])
    return markdown_table(["case", "payload keys", "arrowagg", "DataFusion", "DuckDB",
                           "naive Polars", "Polars floor (its best shape)"], rows)


def _floor_cell(case: dict[str, Any]) -> str:
    found = kernel_floor.over_floor(case)
    if found is None:
        return "not in these results"
    best, _ = found
    return (f"{_ratio(case['peers']['arrowagg']['rows_per_s'], case['peers'][best]['rows_per_s'])}"
            f", {kernel_floor.NAMES[best]}")


RSS_INTRO = """\
1 GB and 10 GB streamed through the daemon's pipeline in a fresh process (the messages
replayed from a pool, processing-time windows of 10 polls); then 4 GB at 10k, 100k and
1M groups a window (the median of three runs). *Steady*: the median RSS over the
second half; *peak*: VmHWM."""


def memory_table(results: dict[str, Any]) -> str:
    memory = results.get("memory", {})
    rows = []
    for kind, runs in (("fixed cardinality", memory.get("fixed", [])),
                       ("cardinality sweep", memory.get("sweep", []))):
        rows += [[kind, gb(run["bytes"]), f"{run['rows'] / 1e6:.0f} M", f"{run['groups']:,}",
                  f"{run['baseline_rss_mb']:.0f}", f"{run['steady_rss_mb']:.0f}",
                  f"{run['peak_rss_mb']:.0f}"] for run in runs]
    return markdown_table(["run", "streamed", "rows", "groups per window", "RSS at start MB",
                           "steady RSS MB", "peak RSS MB"], rows)


LATENCY_INTRO = """\
40 messages a second (event time = wall clock) into 1-second windows; from the send
that closes a window to its last output chunk in a `read_committed` reader's hands."""

_LATENCY_NAMES = {
    "defaults": "shipped defaults (poll_timeout_ms 200, fetch.wait.max.ms 100)",
    "tuned": "poll_timeout_ms 20, fetch.wait.max.ms 10",
}


def latency_table(results: dict[str, Any]) -> str:
    rows = []
    latency = results.get("latency", {})
    for name, run in latency.items():
        if not isinstance(run, dict) or "windows" not in run:
            continue
        inside = run.get("close_to_commit_p50_ms")
        rows.append([_LATENCY_NAMES.get(name, name), str(run["windows"]),
                     f"{run['p50_ms']:.0f}", f"{run['p99_ms']:.0f}", f"{run['max_ms']:.0f}",
                     "" if inside is None else f"{inside:.0f}"])
    early = running.sentence(latency.get("running")) or (
        "\n\nEarly results (`window.emit_every_ms`): not in these results; "
        "`python -m bench --sections latency --update` measures them.")
    return markdown_table(["daemon settings", "windows", "p50 ms", "p99 ms", "max ms",
                           "close -> commit inside the daemon, p50 ms"], rows) + early


def scale_out_caveat(results: dict[str, Any]) -> str:
    """What the table can show on one machine, said beside it: why more instances are
    slower there when they are."""
    runs = [r for r in _median_runs(results["scale_out"]["runs"])
            if _job(r) == "decomposable"]
    single = next((r for r in runs if r["mode"] == "one instance"), runs[0])
    slower = all(r["rows_per_s"] < single["rows_per_s"] for r in runs if r["instances"] > 1)
    cores = results.get("machine", {}).get("cores", "?")
    verdict = ("two or three instances are slower than one, and must be" if slower else
               "more instances are measured here, not more machines")
    return f"""\
The same 1 GB drained by one instance without the scale-out and by 1, 2 and 3 with it
(two stages through a repartition topic), launch to the last window whole.

**On this {cores}-core machine {verdict}**: the instances share its cores with each
other and with the broker, so more of them cannot go faster. What the table shows is
the price of the second stage (every window goes through the repartition topic and
waits for a commit of stage one before stage two reads it) and that the work splits:
the repartition topic carries partial states, O(groups x instances) a window, not
O(rows). What it means for N machines: the findings."""


def _job(run: dict[str, Any]) -> str:
    return str(run.get("job", "decomposable"))  # results before the holistic job had one


def _median_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One run per (job, instances, mode), in the order they first ran: the median one
    by time (the lower middle of an even count), with ``runs_seconds``, all of theirs."""
    alike: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for run in runs:
        alike.setdefault((_job(run), run["instances"], run["mode"]), []).append(run)
    medians = []
    for same in alike.values():
        by_time = sorted(same, key=lambda r: r["seconds"])
        medians.append({**by_time[(len(by_time) - 1) // 2],
                        "runs_seconds": [r["seconds"] for r in by_time]})
    return medians


def _seconds(run: dict[str, Any]) -> str:
    """The median's seconds, and the range of the runs when there were several."""
    times = run["runs_seconds"]
    spread = f" ({len(times)} runs: {times[0]:.1f}-{times[-1]:.1f})" if len(times) > 1 else ""
    return f"{run['seconds']:.1f}{spread}"


def scale_out_table(results: dict[str, Any]) -> str:
    """Each job's runs against that job's one instance: the seed's aggregates, whose
    partial states cross the repartition topic, and a median, whose values do; over
    tumbling windows, then over sessions."""
    figures = results["scale_out"]
    runs = _median_runs(figures["runs"])
    singles = {_job(r): r for r in runs if r["mode"] == "one instance"}
    rows = [[_job(r), str(r["instances"]), r["mode"], _seconds(r),
             f"{r['rows_per_s']:,.0f}",
             f"{r['rows_per_s'] / singles.get(_job(r), runs[0])['rows_per_s']:.2f}x",
             f"{r['repartition_bytes_per_input_gb'] / 1e6:.1f}" if r["repartition_bytes"]
             else "-"] for r in runs]
    head = (f"{figures['rows']:,} rows ({gb(figures['input_bytes'])}, dictionary keys, "
            f"{figures['groups']:,} groups, {figures['windows']} windows), "
            f"{figures['input_partitions']} input and {figures['repartition_partitions']} "
            "repartition partitions. Jobs: `decomposable` is the seed's plan (stage 1 sends "
            "partial states); `holistic` adds `power: median` (stage 1 also sends every "
            "row's `power`)." + _sessions_said(figures) + _repeats_said(runs))
    return head + "\n\n" + markdown_table(
        ["job", "instances", "mode", "seconds", "rows/s", "vs one instance",
         "repartition MB per input GB"], rows)


def _repeats_said(runs: list[dict[str, Any]]) -> str:
    """How the repeated runs are summed up, when some were repeated."""
    if all(len(r["runs_seconds"]) == 1 for r in runs):
        return ""
    return (" Runs repeated (interleaved) are shown by their median run, with the range;"
            " rows/s, the ratio and the bytes are the median run's.")


def _sessions_said(figures: dict[str, Any]) -> str:
    """What the session jobs are, when the results have them (older ones do not)."""
    if "sessions" not in figures:
        return ""
    return (f" `session` and `session holistic` are the same over session windows of a "
            f"{figures['session_gap_ms'] / 1000:g} s gap ({figures['sessions']:,} sessions; "
            "stage 1 sends partial sessions, stage 2 merges them), timed to the last "
            "session out.")


CONTAINERS_INTRO = """\
N replicas of the compose file's daemon (`docker compose up --scale daemon=N`), each
capped to a fraction of a core (standing for a machine of its own); the broker and the
publisher run on the host, uncapped, on the same cores, so they can set the pace: the
CPU columns say who did."""


def containers_table(results: dict[str, Any]) -> str:
    """The runs, the ratios to one container, the CPU spent (or why there are none)."""
    figures = results.get("scale_out_containers")
    if figures is None:
        return ("Not in these results: `python -m bench --sections scale_out_containers "
                "--update` measures it (it needs a Docker engine, which scripts/docker-local "
                "finds or starts).")
    if "skipped" in figures:
        return f"Skipped: {figures['skipped']}."
    one = figures["runs"][0]["rows_per_s"]
    head = (f"{figures['rows']:,} rows ({figures['input_bytes'] / 1e9:.2f} GB, dictionary "
            f"keys, 10,000 groups, {figures['windows']} windows), "
            f"{figures['input_partitions']} input and {figures['repartition_partitions']} "
            f"repartition partitions, {figures['cpus_per_daemon']} of a core a daemon; the "
            "clock runs from the first message published to every window ended "
            f"({figures['engine']}).")
    return head + "\n\n" + markdown_table(
        ["containers", "ready after s", "seconds", "rows/s", "vs one", "daemons' CPU s",
         "broker's CPU s", "publisher's CPU s"],
        [_containers_row(r, one, figures["cpus_per_daemon"]) for r in figures["runs"]])


def _containers_row(run: dict[str, Any], one: float, cpus: float) -> list[str]:
    seconds, daemon = run["seconds"], run["daemon_cpu_s"]
    return [str(run["instances"]), f"{run['ready_s']:.1f}", f"{seconds:.1f}",
            f"{run['rows_per_s']:,.0f}",
            f"{run['rows_per_s'] / one:.2f}x (goal {0.8 * run['instances']:.1f}x)",
            "n/a" if daemon is None else
            f"{daemon:.1f} ({daemon / seconds / (cpus * run['instances']):.0%} of the caps)",
            *("n/a" if run[k] is None else f"{run[k]:.1f} ({run[k] / seconds:.2f} cores)"
              for k in ("broker_cpu_s", "publisher_cpu_s"))]
