"""The memory budget through Apache Kafka: one partition runs 30 windows ahead of the
other, whose first window holds the watermark. With ``over_budget: pause`` the leader is
paused before the groups reach ``max_groups`` and every window comes out final; with
``emit_early`` the open windows go out as non-final revisions. Either way, nothing is
lost or counted twice: the revisions merge to the DuckDB reference."""

from __future__ import annotations

import random
from collections.abc import Sequence

import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

from consumer.kafka.tail import read_output
from consumer.service.observer import NullObserver
from tests.conftest import TopicFactory
from tests.integration.conftest import daemon_settings, publish_tables, running_daemon, wait_for
from tests.integration.data import KEYS, T0, reference, sensor_table

pytestmark = pytest.mark.integration

SIZE_MS = 1_000
WINDOWS = 30
MAX_GROUPS = 100  # 18 (site, sensor, zone) groups a window: the leader alone needs 540


class PausedSeen(NullObserver):
    def __init__(self) -> None:
        self.most_paused = 0
        self.most_groups = 0

    def state(self, *, open_windows: int, groups: int, ready: bool,  # noqa: ARG002
              paused: int = 0) -> None:
        self.most_paused = max(self.most_paused, paused)
        self.most_groups = max(self.most_groups, groups)


def one_window_a_message(partition: int, windows: range) -> list[tuple[int, pa.Table]]:
    rng = random.Random(partition)
    return [(partition, sensor_table(rng, 200, T0 + w * SIZE_MS, SIZE_MS)) for w in windows]


def merged_revisions(frames: Sequence[pl.DataFrame]) -> pl.DataFrame:
    """Each revision covers the rows since the previous one: merge them per group."""
    rows = pl.concat(frames).with_columns(pl.col("window_start").dt.epoch("ms"))
    return rows.group_by("window_start", *KEYS).agg(
        pl.col("reading_sum", "reading_count", "power", "error_count", "row_count").sum(),
        pl.col("reading_min").min(), pl.col("reading_max", "δ_max").max(),
    ).select(reference_columns()).sort(["window_start", *KEYS])


def reference_columns() -> list[str]:
    return ["window_start", *KEYS, "reading_sum", "reading_count", "reading_min",
            "reading_max", "power", "error_count", "δ_max", "row_count"]


@pytest.mark.parametrize("policy", ["pause", "emit_early"])
def test_a_partition_far_ahead_is_paused_or_emitted_early_and_nothing_is_lost(
    bootstrap: str, topic_factory: TopicFactory, policy: str
) -> None:
    source, sink = topic_factory("in", partitions=2), topic_factory("out")
    leader = one_window_a_message(0, range(WINDOWS))
    laggard = one_window_a_message(1, range(WINDOWS))
    settings = daemon_settings(
        bootstrap, source, sink,
        input={"max_groups": MAX_GROUPS, "over_budget": policy},
        window={"kind": "tumbling", "time": "event", "timestamp_column": "ts",
                "size_ms": SIZE_MS, "idle_timeout_ms": 60_000},
        processing={"poll_max_messages": 1})
    seen = PausedSeen()
    with running_daemon(settings, observer=seen) as daemon:
        # The laggard's first window is read first: the fetch order of two partitions is
        # not fixed, and the leader must be the one that runs ahead.
        publish_tables(bootstrap, source, laggard[:1], producer_id="w0")
        wait_for(lambda: daemon.processor.progress.counters.rows >= 200,
                 timeout_s=30, what="the laggard's first window to be read")
        publish_tables(bootstrap, source, leader, producer_id="w1")
        wait_for(lambda: seen.most_paused > 0
                 or daemon.processor.progress.counters.rows >= 200 * 21,
                 timeout_s=30, what="the leader to be paused or to run far ahead")
        publish_tables(bootstrap, source, laggard[1:], producer_id="w2")
        # At the end of a turn, a window no longer open is in a committed transaction.
        wait_for(lambda: (progress := daemon.processor.progress).counters.rows
                 == 200 * 2 * WINDOWS and progress.open_windows <= 1
                 and progress.pending_output == 0,
                 timeout_s=60, what="every window but the last closed and committed")
    windows = list(read_output(bootstrap, sink, idle_timeout_s=3.0))
    finals = [w.final for w in windows]
    print(f"{policy}: {len(windows)} messages, {finals.count(False)} non-final; "
          f"most groups held {seen.most_groups}, most partitions paused {seen.most_paused}")

    data = [t for _, t in [*leader, *laggard]]
    # The last window stays open (an early revision may have emitted part of it).
    closed = pl.col("window_start") < T0 + (WINDOWS - 1) * SIZE_MS
    expected = reference(data, SIZE_MS).filter(closed)
    assert_frame_equal(merged_revisions([w.frame for w in windows]).filter(closed), expected,
                       check_exact=False, rel_tol=1e-9, abs_tol=1e-9, check_dtypes=False)
    assert seen.most_groups < MAX_GROUPS + 2 * 18  # bounded: at most one poll past it
    if policy == "pause":
        assert seen.most_paused == 1
        assert all(finals), "pausing the leader kept every window final"
    else:
        assert seen.most_paused == 0
        assert finals.count(False) > 0, "the budget was reached and windows went out early"
