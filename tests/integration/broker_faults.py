"""The input and the checks of the broker-fault tests, shared with the cluster's."""

from __future__ import annotations

import itertools
import random
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from tests.integration.data import T0, sensor_table

PARTITIONS = 3


SPAN_MS = 30


# Idleness is measured on the daemon's clock as "no message delivered": it cannot tell
# "no input" from "no broker" (nor from a backlog, see the last test). With a timeout
# shorter than an outage every open window would close during it and the rows published
# meanwhile would arrive late. Far above any outage here; the run ends with a sentinel
# batch that moves the watermark instead.
IDLE_TIMEOUT_MS = 120_000


def event_time_batches(rng: random.Random) -> Iterator[tuple[int, pa.Table]]:
    """Endless input, each partition in event-time order."""
    for batch in itertools.count():
        for partition in range(PARTITIONS):
            yield partition, sensor_table(rng, rng.randrange(20, 80), T0 + batch * SPAN_MS,
                                          SPAN_MS)


def stuck_daemon_report(daemon: subprocess.Popen[bytes], log: Path, what: str) -> str:
    """Make a daemon that stopped making progress print every thread's stack (Python's
    faulthandler, on SIGABRT) and return its log's tail for the failure message."""
    if daemon.poll() is None:
        daemon.send_signal(signal.SIGABRT)
        daemon.wait(10)
    return f"{what}; the daemon's log ends:\n{log.read_text()[-6000:]}"
