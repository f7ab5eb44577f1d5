"""End to end through Apache Kafka: several producers and partitions in, windows out,
compared with an independent DuckDB recomputation over the same input rows."""

from __future__ import annotations

import time

import pytest
from polars.testing import assert_frame_equal

from tests.conftest import TopicFactory
from tests.integration.conftest import (
    daemon_settings,
    publish_tables,
    running_daemon,
    wait_all_committed,
    wait_for,
)
from tests.integration.data import KEYS, make_input, output_frame, reference

pytestmark = pytest.mark.integration


def test_event_time_windows_equal_the_reference(
    bootstrap: str, topic_factory: TopicFactory
) -> None:
    source = topic_factory("in", partitions=3)
    sink = topic_factory("out")
    size_ms, span_ms = 500, 40
    data = make_input(batches_per_producer=70, producers=3, span_ms=span_ms)
    total_rows = sum(t.num_rows for _, t in data)
    settings = daemon_settings(bootstrap, source, sink, window={
        "kind": "tumbling", "time": "event", "timestamp_column": "ts", "size_ms": size_ms,
        "allowed_lateness_ms": 0, "idle_timeout_ms": 1500,
    })
    with running_daemon(settings) as daemon:
        publish_tables(bootstrap, source, data[: len(data) // 2], producer_id="w1")
        publish_tables(bootstrap, source, data[len(data) // 2 :], producer_id="w2")
        wait_for(lambda: daemon.processor.progress.counters.rows == total_rows, timeout_s=60,
                 what="the daemon to take every row")
        input_stopped = time.monotonic()
        wait_for(lambda: daemon.processor.progress.settled, timeout_s=30,
                 what="every window closed and committed")
        closed_after_s = time.monotonic() - input_stopped
        wait_all_committed(daemon, settings, rows=total_rows)
    got, starts = output_frame(bootstrap, sink)
    expected = reference([t for _, t in data], size_ms)

    assert sorted(starts) == sorted(set(starts)), "a window was emitted twice"
    assert got.columns == ["window_start", "window_end", *KEYS, "reading_sum", "reading_count",
                           "reading_min", "reading_max", "power", "error_count", "δ_max",
                           "row_count"]
    assert int(got["row_count"].sum()) == total_rows
    assert daemon.processor.counters.late_rows == 0
    assert_frame_equal(got.drop("window_end").sort(["window_start", *KEYS]), expected,
                       check_exact=False, rel_tol=1e-9, abs_tol=1e-9, check_dtypes=False)
    assert (got["window_end"].dt.epoch("ms") - got["window_start"] == size_ms).all()
    # Idle close: once input stops, the last windows come out within idle_timeout + one
    # window (1.5 s + 0.5 s here; the rest is polling and commit slack).
    print(f"idle close: last windows closed {closed_after_s:.2f}s after the input stopped")
    assert closed_after_s < 1.5 + 0.5 + 1.0
