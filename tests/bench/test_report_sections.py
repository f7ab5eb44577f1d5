"""The page's measured sections, rendered from hand-made results."""

from __future__ import annotations

from typing import Any

from bench import report_sections


def containers(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"scale_out_containers": {
        "cpus_per_daemon": 0.5, "input_partitions": 4, "repartition_partitions": 6,
        "windows": 8, "rows": 10_000_000, "input_bytes": 5e8, "engine": "private dockerd",
        "runs": runs}}


def test_the_containers_table_gives_each_run_its_ratio_to_one_and_the_cpu_spent() -> None:
    runs = [{"instances": n, "ready_s": 5.0, "publish_s": 4.0, "seconds": 10.0 / n,
             "rows_per_s": 1e6 * n, "daemon_cpu_s": 4.0, "broker_cpu_s": 2.0,
             "publisher_cpu_s": None} for n in (1, 2, 3)]
    text = report_sections.containers_table(containers(runs))
    rows = [line for line in text.splitlines() if line.startswith("| 3 |")]
    assert rows == [("| 3 | 5.0 | 3.3 | 3,000,000 | 3.00x (goal 2.4x) | "
                    "4.0 (80% of the caps) | 2.0 (0.60 cores) | n/a |")]


def test_the_containers_section_says_why_it_has_no_figures() -> None:
    skipped = {"scale_out_containers": {"skipped": "no engine"}}
    assert report_sections.containers_table(skipped) == "Skipped: no engine."
    assert "--sections scale_out_containers" in report_sections.containers_table({})


def scale_out(rates: list[tuple[int, str, float]]) -> dict[str, Any]:
    return {"machine": {"cores": 2}, "scale_out": {"runs": [
        {"instances": n, "mode": mode, "seconds": 1.0, "rows_per_s": rate,
         "repartition_bytes": 0 if mode == "one instance" else 25e6,
         "repartition_bytes_per_input_gb": 0 if mode == "one instance" else 25e6}
        for n, mode, rate in rates]}}


def test_the_scale_out_caveat_says_why_more_instances_are_slower_on_one_machine() -> None:
    slower = scale_out([(1, "one instance", 4e6), (1, "two stages", 3e6),
                        (2, "two stages", 2e6), (3, "two stages", 1.5e6)])
    text = " ".join(report_sections.scale_out_caveat(slower).split())
    assert "**On this 2-core machine two or three instances are slower than one" in text
    assert "share its cores with each other and with the broker" in text
    faster = scale_out([(1, "one instance", 4e6), (2, "two stages", 5e6)])
    assert "slower than one" not in report_sections.scale_out_caveat(faster)


def test_the_kernel_table_has_a_row_a_case_and_arrowagg_over_each_peer() -> None:
    case = {"case": "c", "encoding": "plain", "groups": 10, "peers": {
        name: {"median_s": s, "rows_per_s": 1e7 / s} for name, s in (
            ("arrowagg", 1.0), ("datafusion", 0.5), ("duckdb", 2.0), ("polars_naive", 4.0),
            ("polars_with_output", 0.9), ("polars_per_poll", 0.8),
            ("polars_read_ahead", 0.85))}}
    [row] = report_sections.kernel_table({"kernel": [case]}).splitlines()[2:]
    assert row == ("| c | plain | 10.0 | 20.0 (0.50x) | 5.0 (2.00x) | 2.5 (4.00x) "
                   "| 12.5 (0.80x), per poll |")


def test_the_readers_are_set_against_the_faster_raw_read() -> None:
    readers = {"raw_daemon_batches": {"rows_per_s": 20e6, "bytes": 1e9},
               "raw_small_batches": {"rows_per_s": 10e6, "bytes": 1e9},
               "daemon": {"rows_per_s": 5e6}, "polars_reader": {"rows_per_s": 8e6}}
    [row] = report_sections.e2e_table(
        {"e2e": {"encodings": {"plain": readers}}}).splitlines()[2:]
    assert row == "| plain | 1.0 GB | 20.0 | 5.0 (0.25x) | 8.0 (0.40x) |  |  |"


def test_the_scale_out_table_sets_each_job_against_its_own_one_instance() -> None:
    results = scale_out([(1, "one instance", 4e6), (2, "two stages", 2e6)])
    holistic = scale_out([(1, "one instance", 2e6), (2, "two stages", 1.5e6)])
    for run in holistic["scale_out"]["runs"]:
        run["job"] = "holistic"
    results["scale_out"].update(rows=10, input_bytes=1e9, groups=10, windows=1,
                                input_partitions=4, repartition_partitions=6)
    results["scale_out"]["runs"] += holistic["scale_out"]["runs"]
    rows = report_sections.scale_out_table(results).splitlines()[4:]
    assert rows == ["| decomposable | 1 | one instance | 1.0 | 4,000,000 | 1.00x | - |",
                    "| decomposable | 2 | two stages | 1.0 | 2,000,000 | 0.50x | 25.0 |",
                    "| holistic | 1 | one instance | 1.0 | 2,000,000 | 1.00x | - |",
                    "| holistic | 2 | two stages | 1.0 | 1,500,000 | 0.75x | 25.0 |"]


def test_repeated_scale_out_runs_are_set_against_each_other_by_their_median_run() -> None:
    # Interleaved repeats, as bench.scale_out.measure runs them: one instance's times
    # 4, 8, 5 s (median 5), two stages' 9, 6, 7 s (median 7).
    results = scale_out([])
    for one, two in ((4.0, 9.0), (8.0, 6.0), (5.0, 7.0)):
        for mode, seconds in (("one instance", one), ("two stages", two)):
            results["scale_out"]["runs"].append({
                "instances": 1, "mode": mode, "seconds": seconds, "rows_per_s": 35e6 / seconds,
                "repartition_bytes": 0 if mode == "one instance" else seconds * 1e6,
                "repartition_bytes_per_input_gb": 0 if mode == "one instance" else seconds * 1e6})
    results["scale_out"]["runs"].append({
        "instances": 2, "mode": "two stages", "seconds": 10.0, "rows_per_s": 3.5e6,
        "repartition_bytes": 1, "repartition_bytes_per_input_gb": 30e6})
    results["scale_out"].update(rows=35_000_000, input_bytes=1e9, groups=10, windows=1,
                                input_partitions=4, repartition_partitions=6)
    head, _, table = report_sections.scale_out_table(results).partition("\n\n")
    assert "shown by their median run, with the range" in head
    assert table.splitlines()[2:] == [
        "| decomposable | 1 | one instance | 5.0 (3 runs: 4.0-8.0) | 7,000,000 | 1.00x | - |",
        "| decomposable | 1 | two stages | 7.0 (3 runs: 6.0-9.0) | 5,000,000 | 0.71x | 7.0 |",
        "| decomposable | 2 | two stages | 10.0 | 3,500,000 | 0.50x | 30.0 |"]
    assert "slower than one" in report_sections.scale_out_caveat(results)


def test_the_scale_out_table_has_the_session_jobs_and_says_what_they_are() -> None:
    results = scale_out([(1, "one instance", 4e6), (3, "two stages", 2e6)])
    results["scale_out"].update(rows=10, input_bytes=1e9, groups=10, windows=1,
                                input_partitions=4, repartition_partitions=6)
    without = report_sections.scale_out_table(results)
    assert "session" not in without  # results from before the session jobs
    for job, rates in (("session", (3e6, 1e6)), ("session holistic", (2e6, 5e5))):
        runs = scale_out([(1, "one instance", rates[0]), (3, "two stages", rates[1])])
        results["scale_out"]["runs"] += [{**run, "job": job, "sessions": 12_345}
                                         for run in runs["scale_out"]["runs"]]
    results["scale_out"].update(sessions=12_345, session_gap_ms=1_000)
    head, _, table = report_sections.scale_out_table(results).partition("\n\n")
    assert ("`session` and `session holistic` are the same over session windows of a 1 s "
            "gap (12,345 sessions;") in head
    assert table.splitlines()[4:] == [
        "| session | 1 | one instance | 1.0 | 3,000,000 | 1.00x | - |",
        "| session | 3 | two stages | 1.0 | 1,000,000 | 0.33x | 25.0 |",
        "| session holistic | 1 | one instance | 1.0 | 2,000,000 | 1.00x | - |",
        "| session holistic | 3 | two stages | 1.0 | 500,000 | 0.25x | 25.0 |"]
