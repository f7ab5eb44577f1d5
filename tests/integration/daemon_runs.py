"""The daemon as a process of its own: its configuration, started and stopped by a test, run
through SIGKILLs and restarts; the helpers the recovery and fault tests share."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import yaml
from confluent_kafka import Producer

from tests.conftest import REPO
from tests.integration.conftest import (
    committed_offsets,
    end_offsets,
    publish_tables,
    wait_for,
)
from tests.integration.data import KEYS

SIZE_MS = 400


IDLE_TIMEOUT_MS = 1500


# A stop comes at most this long after a chunk is published. It must stay well below the
# idle timeout: a daemon that sees no input for IDLE_TIMEOUT_MS closes its open windows
# (as designed), so a longer pause would emit a window holding only this chunk's part of
# it, and the next chunk's rows of that window would arrive late.
_MAX_PAUSE_S = IDLE_TIMEOUT_MS / 1000 * 2 / 3


def write_config(path: Path, bootstrap: str, source: str, sink: str, group: str, *,
                 instance_id: str = "instance-0", guarantee: str = "exactly_once",
                 consumer: dict[str, Any] | None = None, dlq_topic: str | None = None,
                 late_topic: str | None = None, window: dict[str, Any] | None = None,
                 aggregation: dict[str, Any] | None = None) -> Path:
    """``window``: the window section instead of SIZE_MS tumbling event-time windows;
    ``aggregation``: the aggregation section instead of the plan derived from the schema."""
    routes = {"dlq_topic": dlq_topic, "late_topic": late_topic}
    config = {
        "kafka": {"bootstrap_servers": bootstrap, "group_id": group,
                  "consumer": consumer or {}},
        "input": {"topics": [source]},
        "output": {"topic": sink, **{k: v for k, v in routes.items() if v}},
        "window": window or {"kind": "tumbling", "time": "event", "timestamp_column": "ts",
                             "size_ms": SIZE_MS, "idle_timeout_ms": IDLE_TIMEOUT_MS},
        **({"aggregation": aggregation} if aggregation else {}),
        "processing": {"instance_id": instance_id, "guarantee": guarantee,
                       "poll_max_messages": 20, "poll_timeout_ms": 100,
                       "commit_interval_ms": 200},
        "service": {"http_port": 0, "statistics_interval_ms": 0},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def start_daemon(config: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "consumer", "run", "--config", str(config)],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


_RUNNING_LINE = "arrowagg consuming"  # logged once the stop handlers are installed


def start_running_daemon(config: Path, log: Path) -> subprocess.Popen[bytes]:
    """Start a daemon and wait until it runs: a stop sent while Python is still importing
    would end it by the default signal action, not test the daemon's stop."""
    before = log.read_text().count(_RUNNING_LINE) if log.exists() else 0
    daemon = start_daemon(config, log)
    wait_for(lambda: daemon.poll() is not None or log.read_text().count(_RUNNING_LINE) > before,
             timeout_s=60, what="the daemon to start")
    assert daemon.poll() is None, log.read_text()[-3000:]
    return daemon


def sorted_rows(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.drop("window_end").sort(["window_start", *KEYS])


def run_with_faults(bootstrap: str, config: Path, log: Path, data: list[tuple[int, pa.Table]],
                    *, stop_signal: signal.Signals, stops: int, rng: random.Random,
                    poison: Sequence[tuple[int, bytes]] = ()) -> list[int]:
    """Publish ``data`` in ``stops`` chunks (each followed by one ``poison`` message per
    partition given), stopping the daemon with ``stop_signal`` at a random moment after
    each and starting it again; returns the exit codes seen."""
    codes = []
    daemon = start_running_daemon(config, log)
    try:
        size = -(-len(data) // stops)  # contiguous chunks keep event time in order
        chunks = [data[i:i + size] for i in range(0, len(data), size)]
        for number, chunk in enumerate(chunks):
            publish_tables(bootstrap, config_source(config), chunk, producer_id=f"w{number}")
            publish_raw(bootstrap, config_source(config), poison)
            time.sleep(rng.uniform(0.3, _MAX_PAUSE_S))
            daemon.send_signal(stop_signal)
            codes.append(daemon.wait(30))
            daemon = start_running_daemon(config, log)
        # The rest consumed and the last windows closed on idleness: every input offset
        # committed (as the broker tells it, not a guess at how long that takes).
        source, group = config_source(config), config_group(config)
        wait_for(lambda: committed_offsets(bootstrap, group, source)
                 == end_offsets(bootstrap, source), timeout_s=60,
                 what="the daemon to commit the whole input",
                 seen=lambda: f"committed {committed_offsets(bootstrap, group, source)}, "
                              f"end {end_offsets(bootstrap, source)}; daemon log:\n"
                              f"{log.read_text()[-3000:]}")
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(30) == 0, log.read_text()[-3000:]
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(10)  # reaped, or Popen warns in a later test
    return codes


def publish_raw(bootstrap: str, topic: str, values: Sequence[tuple[int, bytes]]) -> None:
    if not values:
        return
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for partition, value in values:
        producer.produce(topic, value, partition=partition)
    assert producer.flush(30) == 0


def config_source(config: Path) -> str:
    return str(yaml.safe_load(config.read_text())["input"]["topics"][0])


def config_group(config: Path) -> str:
    return str(yaml.safe_load(config.read_text())["kafka"]["group_id"])
