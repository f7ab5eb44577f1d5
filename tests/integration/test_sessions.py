"""Session windows end to end through Apache Kafka, compared with DuckDB: keys spread
over three partitions (so sessions merge across partitions), then the same input with
the daemon SIGKILLed again and again mid-stream."""

from __future__ import annotations

import random
import re
import signal
import time
from pathlib import Path

import pytest
import yaml
from polars.testing import assert_frame_equal

from tests.conftest import TopicFactory
from tests.integration.conftest import (
    daemon_settings,
    publish_tables,
    running_daemon,
    wait_all_committed,
)
from tests.integration.daemon_runs import IDLE_TIMEOUT_MS, run_with_faults
from tests.integration.data import KEYS, output_frame
from tests.integration.faults import write_figures
from tests.integration.session_data import (
    GAP_MS,
    session_input,
    session_reference,
    sessions_of,
)

pytestmark = pytest.mark.integration

def test_session_windows_equal_the_reference(bootstrap: str, topic_factory: TopicFactory,
                                             ) -> None:
    source, sink = topic_factory("in", partitions=3), topic_factory("out")
    data = session_input(batches_per_producer=60, producers=3, span_ms=40)
    total_rows = sum(t.num_rows for _, t in data)
    settings = daemon_settings(bootstrap, source, sink, window={
        "kind": "session", "time": "event", "timestamp_column": "ts", "gap_ms": GAP_MS,
        "allowed_lateness_ms": 0, "idle_timeout_ms": 1500,
    })
    with running_daemon(settings) as daemon:
        publish_tables(bootstrap, source, data, producer_id="w1")
        wait_all_committed(daemon, settings, rows=total_rows)
    got, _ = output_frame(bootstrap, sink)
    expected = session_reference([t for _, t in data], GAP_MS)

    assert got.columns == ["window_start", "window_end", *KEYS, "reading_sum", "reading_count",
                           "reading_min", "reading_max", "power", "error_count", "δ_max",
                           "row_count"]
    sessions = got.select("window_start", *KEYS)
    assert sessions.height == sessions.unique().height, "a session was emitted twice"
    assert daemon.processor.counters.late_rows == 0
    assert_frame_equal(sessions_of(got), expected, check_exact=False, rel_tol=1e-9,
                       abs_tol=1e-9, check_dtypes=False)
    lengths = (expected["window_end"] - expected["window_start"]).to_list()
    print(f"sessions: {expected.height} from {total_rows} rows; lengths "
          f"{min(lengths)}..{max(lengths)} ms")
    assert max(lengths) > 10 * GAP_MS  # some sessions run over many gaps


def write_session_config(path: Path, bootstrap: str, source: str, sink: str) -> Path:
    config = {
        "kafka": {"bootstrap_servers": bootstrap, "group_id": f"g-{source}"},
        "input": {"topics": [source]},
        "output": {"topic": sink},
        "window": {"kind": "session", "time": "event", "timestamp_column": "ts",
                   "gap_ms": GAP_MS, "idle_timeout_ms": IDLE_TIMEOUT_MS},
        "processing": {"instance_id": "instance-0", "poll_max_messages": 20,
                       "poll_timeout_ms": 100, "commit_interval_ms": 200},
        "service": {"http_port": 0, "statistics_interval_ms": 0},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def test_sigkills_mid_stream_keep_sessions_exact(bootstrap: str, topic_factory: TopicFactory,
                                                 tmp_path: Path) -> None:
    source, sink = topic_factory("in", partitions=3), topic_factory("out")
    config = write_session_config(tmp_path / "config.yaml", bootstrap, source, sink)
    log = tmp_path / "daemon.log"
    data = session_input(batches_per_producer=80, producers=3, span_ms=30)
    kills = 12
    started = time.monotonic()
    codes = run_with_faults(bootstrap, config, log, data, stop_signal=signal.SIGKILL,
                            stops=kills, rng=random.Random(23))
    got, _ = output_frame(bootstrap, sink)
    expected = session_reference([t for _, t in data], GAP_MS)
    sessions = got.select("window_start", *KEYS)
    text = log.read_text()
    skipped = [int(n) for n in re.findall(r"session replay over: (\d+) replayed rows", text)]
    write_figures("session_sigkill", {
        "sigkills": len(codes), "sessions": expected.height,
        "rows": int(got["row_count"].sum()),
        "duplicates": sessions.height - sessions.unique().height,
        "lost": expected.height - sessions.unique().height,
        "replays": len(skipped), "replayed_rows_of_emitted_sessions_skipped": sum(skipped),
        "seconds": round(time.monotonic() - started, 1),
    })
    assert codes == [-signal.SIGKILL] * kills
    # The kills left rows of sessions already emitted to replay, and they were skipped.
    assert sum(skipped) > 0
    assert sessions.height == sessions.unique().height, "a session was emitted twice"
    assert int(got["row_count"].sum()) == sum(t.num_rows for _, t in data)
    assert_frame_equal(sessions_of(got), expected, check_exact=False, rel_tol=1e-9,
                       abs_tol=1e-9, check_dtypes=False)
    assert text.count("stopped cleanly") == 1
