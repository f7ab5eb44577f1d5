"""The container scale-out section's pure parts: its table and the CPU readings it
relies on. The section itself needs a Docker engine and runs in `make bench`."""

from __future__ import annotations

import os
import time

from bench.scale_out_containers import process_cpu_s, table, with_section


def test_the_table_gives_each_run_its_ratio_to_one_and_the_cpu_spent() -> None:
    runs = [{"instances": n, "ready_s": 5.0, "publish_s": 4.0, "seconds": 10.0 / n,
             "rows_per_s": 1e6 * n, "daemon_cpu_s": 4.0, "broker_cpu_s": 2.0,
             "publisher_cpu_s": None} for n in (1, 2, 3)]
    text = table({"cpus_per_daemon": 0.5, "input_partitions": 4, "repartition_partitions": 6,
                  "windows": 8, "rows": 10_000_000, "input_bytes": 5e8,
                  "engine": "private dockerd", "runs": runs})
    rows = [line for line in text.splitlines() if line.startswith("| 3 |")]
    assert rows == [("| 3 | 5.0 | 3.3 | 3,000,000 | 3.00x (goal 2.4x) | "
                    "4.0 (80% of the caps) | 2.0 (0.60 cores) | n/a |")]


def test_a_skipped_section_says_why() -> None:
    assert table({"skipped": "no engine"}) == "Skipped: no engine."


def test_a_process_cpu_time_grows_as_it_works() -> None:
    before = process_cpu_s(os.getpid())
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    assert process_cpu_s(os.getpid()) - before >= 0.1


def test_the_section_goes_after_the_others_and_before_the_method() -> None:
    doc = "# Benchmarks\n\n## 5. Scale-out\n\nx\n\n## How it is measured\n\ny\n"
    text = with_section(doc, {"scale_out_containers": {"skipped": "no engine"}})
    assert text.index("## 5.") < text.index("## 6. Scale-out in containers") \
        < text.index("Skipped: no engine.") < text.index("## How it is measured")
    assert with_section(doc, {}) == doc
