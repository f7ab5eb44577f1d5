"""A process group's resident memory, read from /proc for real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.process_rss import RssSampler, group_rss_kb

# A parent that holds ~64 MiB and a child of its own that holds ~32 MiB, both waiting.
HOLDER = """
import subprocess, sys, time
held = bytearray(64 * 2**20)
child = subprocess.Popen([sys.executable, "-c",
    "import time; held = bytearray(32 * 2**20); print('ready', flush=True); time.sleep(60)"],
    stdout=subprocess.PIPE, text=True)
child.stdout.readline()
print("ready", flush=True)
time.sleep(60)
"""


def _vm_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def test_the_whole_group_counts_and_nothing_else() -> None:
    process = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "ready\n"
        leader = _vm_rss_kb(process.pid)
        total = group_rss_kb(process.pid)
        assert leader >= 64 * 1024
        assert total >= leader + 32 * 1024  # the child is in the group
        assert group_rss_kb(os.getpgrp()) > 0  # this test's own group, apart
        assert total < leader + 32 * 1024 + 64 * 1024  # and nothing else
        sampler = RssSampler(process.pid, interval_s=0.01)
        sampler.start()
        samples = sampler.stop()
        assert samples
        assert all(kb >= leader for _, kb in samples)
    finally:
        os.killpg(process.pid, 9)
        process.wait()
        if process.stdout is not None:
            process.stdout.close()
    assert group_rss_kb(process.pid) == 0
