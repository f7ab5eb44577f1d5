"""A process group's resident memory, read from /proc for real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
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


def _group_pids(group: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2]) == group:
                    pids.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return pids


def _exited(pid: int) -> bool:
    """Dead: gone, or a zombie (its memory freed; init reaps it in its own time)."""
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                in ("Z", "X"))
    except OSError:
        return True


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
        members = _group_pids(process.pid)
        assert len(members) == 2  # the leader and its child
    finally:
        os.killpg(process.pid, 9)
        process.wait()
        if process.stdout is not None:
            process.stdout.close()
    # The child is not ours to wait for: a killed process keeps its memory until it has
    # exited, which on a busy machine can be after its group leader is reaped.
    deadline = time.monotonic() + 30
    while not all(_exited(pid) for pid in members) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(_exited(pid) for pid in members)
    assert group_rss_kb(process.pid) == 0
