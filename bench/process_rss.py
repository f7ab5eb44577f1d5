"""The resident memory of a process group, sampled while it runs.

A peer is launched as the leader of a process group of its own (``bench.peers``), so its
memory is the sum of VmRSS over the group's processes: PyFlink's JVM is a child of its
Python, and both count.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

PROC = Path("/proc")


def group_rss_kb(group: int, proc: Path = PROC) -> int:
    """VmRSS summed over the live processes of process group ``group``, in KiB."""
    total = 0
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after its ")"
            if int(stat.rsplit(")", 1)[1].split()[2]) != group:
                continue
            total += _vm_rss_kb((entry / "status").read_text())
        except (OSError, IndexError, ValueError):
            continue  # it ended while being read
    return total


def _vm_rss_kb(status: str) -> int:
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0  # a zombie has no VmRSS


class RssSampler(threading.Thread):
    """Samples a process group's RSS every ``interval_s`` until stopped:
    ``samples`` holds (wall time, KiB) pairs."""

    def __init__(self, group: int, interval_s: float = 0.2) -> None:
        super().__init__(name=f"rss-{group}", daemon=True)
        self.group = group
        self.interval_s = interval_s
        self.samples: list[tuple[float, int]] = []
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.is_set():
            self.samples.append((time.time(), group_rss_kb(self.group)))
            self._stopping.wait(self.interval_s)

    def stop(self) -> list[tuple[float, int]]:
        self._stopping.set()
        self.join(5)
        return self.samples
