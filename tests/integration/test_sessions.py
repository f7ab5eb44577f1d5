"""Session windows end to end through Apache Kafka, compared with DuckDB: keys spread
over three partitions (so sessions merge across partitions), then the same input with
the daemon SIGKILLed again and again mid-stream."""

from __future__ import annotations

import random
import re
import signal
import time
import zlib
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
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
from tests.integration.data import KEYS, T0, output_frame, sensor_table
from tests.integration.faults import write_figures

pytestmark = pytest.mark.integration

GAP_MS = 100
SITES, SENSORS, ZONES = ["site-0", "site-1", "site-2"], ["ünï", 'b "q"', "c"], ["north", "south"]


def active(key: tuple[str, str, str], block: int) -> bool:
    """Whether ``key`` has rows in ``block``: two blocks in three, so some keys pause
    for a block (longer than the gap) and their sessions end, others run on."""
    return zlib.crc32(f"{key}/{block}".encode()) % 3 != 0


def session_input(batches_per_producer: int, producers: int, span_ms: int,
                  ) -> list[tuple[int, pa.Table]]:
    """Each producer writes its own partition in event-time order; every key lives in
    every partition, in blocks of four batches (longer than the gap)."""
    rng = random.Random(17)
    keys = [(s, n, z) for s in SITES for n in SENSORS for z in ZONES]
    out = []
    for batch in range(batches_per_producer):
        live = [k for k in keys if active(k, batch // 4)] or keys[:1]
        for producer in range(producers):
            table = sensor_table(rng, rng.randrange(20, 120), T0 + batch * span_ms, span_ms)
            picked = [rng.choice(live) for _ in range(table.num_rows)]
            for i, name in enumerate(KEYS):
                table = table.set_column(table.schema.get_field_index(name), name,
                                         pa.array([k[i] for k in picked]))
            out.append((producer, table))
    return out


def session_reference(tables: list[pa.Table], gap_ms: int) -> pl.DataFrame:
    """Sessions in DuckDB SQL: LAG over each key's rows in time order marks where the gap
    is reached, a running SUM numbers the sessions, GROUP BY aggregates them."""
    rows = pa.concat_tables(tables)  # noqa: F841 - read by DuckDB's replacement scan
    keys = ", ".join(f'"{k}"' for k in KEYS)
    sql = f"""
        WITH timed AS (SELECT *, epoch_ms(ts) AS t FROM rows),
        marked AS (
            SELECT *, CASE WHEN t - LAG(t) OVER (PARTITION BY {keys} ORDER BY t) < {gap_ms}
                      THEN 0 ELSE 1 END AS starts
            FROM timed),
        numbered AS (
            SELECT *, SUM(starts) OVER (PARTITION BY {keys} ORDER BY t, starts DESC
                                        ROWS UNBOUNDED PRECEDING) AS session
            FROM marked)
        SELECT MIN(t) AS window_start, MAX(t) + {gap_ms} AS window_end, {keys},
               SUM(reading_sum) AS reading_sum, SUM(reading_count)::BIGINT AS reading_count,
               MIN(reading_min) AS reading_min, MAX(reading_max) AS reading_max,
               SUM(power) AS power, SUM(error_count)::BIGINT AS error_count,
               MAX("δ_max") AS "δ_max", COUNT(*)::BIGINT AS row_count
        FROM numbered GROUP BY {keys}, session
    """  # noqa: S608 - only integers and the fixed key names are formatted in
    relation = duckdb.sql(sql)
    assert relation is not None
    return pl.DataFrame(relation.arrow()).sort(["window_start", *KEYS])


def sessions_of(frame: pl.DataFrame) -> pl.DataFrame:
    """Output rows with epoch-ms bounds, in the reference's order."""
    return frame.with_columns(pl.col("window_end").dt.epoch("ms")).sort(
        ["window_start", *KEYS])


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
