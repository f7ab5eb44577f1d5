"""The container scale-out section's pure parts: the CPU readings it relies on. The
section itself needs a Docker engine and runs in `make bench`; its table is
bench.report_sections' (tests/bench/test_report_sections.py)."""

from __future__ import annotations

import os
import time

from bench.scale_out_containers import process_cpu_s


def test_a_process_cpu_time_grows_as_it_works() -> None:
    before = process_cpu_s(os.getpid())
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    assert process_cpu_s(os.getpid()) - before >= 0.1
