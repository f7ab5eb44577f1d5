"""The daemon as a real process: SIGKILL it mid-stream, restart it, and the committed
output still equals the reference — nothing lost, no window twice. SIGTERM exits 0."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from polars.testing import assert_frame_equal

from tests.conftest import REPO, TopicFactory
from tests.integration.conftest import publish_tables
from tests.integration.test_pipeline import KEYS, make_input, output_frame, reference

pytestmark = pytest.mark.integration


def write_config(path: Path, bootstrap: str, source: str, sink: str, group: str) -> Path:
    config = {
        "kafka": {"bootstrap_servers": bootstrap, "group_id": group},
        "input": {"topics": [source]},
        "output": {"topic": sink},
        "window": {"kind": "tumbling", "time": "event", "timestamp_column": "ts",
                   "size_ms": 400, "idle_timeout_ms": 1500},
        "processing": {"instance_id": "instance-0", "poll_max_messages": 20,
                       "poll_timeout_ms": 100, "commit_interval_ms": 200},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def start_daemon(config: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "consumer", "run", "--config", str(config)],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


def test_sigkill_and_restart_loses_nothing_and_duplicates_nothing(
    bootstrap: str, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    source = topic_factory("in", partitions=3)
    sink = topic_factory("out")
    config = write_config(tmp_path / "config.yaml", bootstrap, source, sink,
                          group=f"g-{source}")
    log = tmp_path / "daemon.log"
    data = make_input(batches_per_producer=60, producers=3, span_ms=30)
    rng = random.Random(11)
    kills = 0
    daemon = start_daemon(config, log)
    try:
        chunk = len(data) // 4
        for part in range(4):
            publish_tables(bootstrap, source, data[part * chunk:(part + 1) * chunk]
                           if part < 3 else data[3 * chunk:], producer_id=f"w{part}")
            time.sleep(rng.uniform(0.5, 2.0))
            daemon.kill()  # SIGKILL: no shutdown code runs
            daemon.wait(10)
            kills += 1
            daemon = start_daemon(config, log)
        time.sleep(6)  # consume the rest and close the last windows on idleness
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(30) == 0, log.read_text()[-3000:]
    finally:
        if daemon.poll() is None:
            daemon.kill()
    got, starts = output_frame(bootstrap, sink)
    expected = reference([t for _, t in data], 400)
    print(f"recovery: {kills} SIGKILLs survived, {len(starts)} windows, "
          f"{int(got['row_count'].sum())} rows")
    assert sorted(starts) == sorted(set(starts)), "a window was emitted twice"
    assert int(got["row_count"].sum()) == pa.concat_tables([t for _, t in data]).num_rows
    assert_frame_equal(got.drop("window_end").sort(["window_start", *KEYS]), expected,
                       check_exact=False, rel_tol=1e-9, abs_tol=1e-9, check_dtypes=False)
    assert "stopped cleanly" in log.read_text()
