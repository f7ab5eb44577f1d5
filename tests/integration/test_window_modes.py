"""Processing-time and count windows through Apache Kafka: totals are conserved."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from consumer.kafka.tail import read_output
from tests.conftest import TopicFactory
from tests.integration.conftest import (
    daemon_settings,
    publish_tables,
    running_daemon,
    wait_all_committed,
)
from tests.integration.data import T0, make_input

pytestmark = pytest.mark.integration


def _totals(tables: list[pa.Table]) -> tuple[int, float, int]:
    rows = pa.concat_tables(tables)
    return (rows.num_rows, float(pc.sum(rows["reading_sum"]).as_py()),
            int(pc.sum(rows["reading_count"]).as_py()))


@pytest.mark.parametrize(
    "window",
    [
        {"kind": "tumbling", "time": "processing", "size_ms": 300},
        {"kind": "hopping", "time": "processing", "size_ms": 600, "step_ms": 300},
        {"kind": "count", "count_batches": 17},
        {"kind": "count", "count_rows": 1000},
    ],
    ids=["processing-tumbling", "processing-hopping", "count-batches", "count-rows"],
)
def test_window_totals_are_conserved(
    bootstrap: str, topic_factory: TopicFactory, window: dict[str, object]
) -> None:
    source = topic_factory("in", partitions=2)
    sink = topic_factory("out")
    data = make_input(batches_per_producer=40, producers=2, span_ms=50)
    rows, reading_sum, reading_count = _totals([t for _, t in data])
    # Count windows close after a second without input; processing-time ones on the clock.
    idle = {"idle_timeout_ms": 1000} if window["kind"] == "count" else {}
    settings = daemon_settings(bootstrap, source, sink, window={**window, **idle})
    with running_daemon(settings) as daemon:
        publish_tables(bootstrap, source, data)
        aborts = wait_all_committed(daemon, settings, rows=rows).counters.aborts
    windows = list(read_output(bootstrap, sink, idle_timeout_s=3.0))
    print(f"{window}: {len(windows)} windows, {aborts} aborted transactions")
    out = pa.concat_tables([w.frame.to_arrow() for w in windows])
    # A hopping row lands in size/step windows; everything else in exactly one.
    copies = 2 if window["kind"] == "hopping" else 1
    assert int(pc.sum(out["row_count"]).as_py()) == copies * rows
    assert float(pc.sum(out["reading_sum"]).as_py()) == pytest.approx(copies * reading_sum,
                                                                      rel=1e-9)
    assert int(pc.sum(out["reading_count"]).as_py()) == copies * reading_count
    assert sum(w.window_rows for w in windows) == copies * rows
    if window["kind"] == "count" and "count_batches" in window:
        # Every window but the last (closed by idleness) holds exactly N batches' rows.
        assert len(windows) == -(-len(data) // 17)
    starts = [w.start_ms for w in windows]
    assert len(starts) == len(set(starts)), "a window was emitted twice"
    assert all(w.start_ms >= T0 for w in windows)
