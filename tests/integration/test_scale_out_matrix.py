"""Scaling out costs no feature, through Apache Kafka: each cell of window kind x late
policy runs with the scale-out, a plan mixing aggregates that merge with ones that need
the window's values (median, quantile, n_unique, an expression), workers keyed by
worker (every partition holds every group) and, while they publish, instances that come
and go: 1 -> 3 instances, a SIGKILL and restart, an instance stalled past
max.poll.interval.ms, a zombie fencing its elder, then 3 -> 2. With late: revise, late
rows keep coming: some within revision_lateness_ms (they revise emitted windows), some
beyond it (the late topic).

Each cell: what a subscriber holds after applying every committed revision equals DuckDB
over every (row, window) not sent to the late topic; one final row per (window, keys);
every part of every window ended; no duplicate, nothing lost; every exit clean.

Session windows are cells of their own (aggregates that merge, late: topic; the holistic
plan with late: topic and late: revise): partial sessions of every key come from every
partition and instance, and some rows come far behind (late) or just behind (merged),
and, under late: revise, behind sessions that went out (they revise them); what a
subscriber holds from each part's frontier-marked batches, every revision applied,
equals DuckDB's sort-and-scan over the rows not sent late.
"""

from __future__ import annotations

import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

from consumer.kafka.tail import read_output
from tests.conftest import TopicFactory
from tests.integration.cells import (
    AGGREGATION,
    GAP_MS,
    LATE,
    SESSION_PLANS,
    after_the_end,
    held_rows,
    held_sessions,
    late_pairs,
    numbered,
    session_cell_input,
)
from tests.integration.data import KEYS, T0, sensor_table
from tests.integration.faults import (
    DurablePublisher,
    PacedPublishing,
    wait_until,
    write_figures,
)
from tests.integration.instances import (
    FENCED_EXIT_S,
    INPUT_PARTITIONS,
    REPARTITIONS,
    SIZE_MS,
    STEP_MS,
    WORKERS,
    Instances,
    make_topics,
    session_frontiers,
    wait_all_windows,
)
from tests.integration.session_data import session_reference

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 100  # event time a cell's workers cover: 100 x 50 ms, 12 windows of 400 ms
STALL_S = 10.0  # past max.poll.interval.ms (8 s)
STEPS_MS = {"tumbling": SIZE_MS, "hopping": SIZE_MS // 2}  # a window's step


@dataclass(frozen=True)
class Cell:
    kind: str
    late: str

    @property
    def sections(self) -> dict[str, dict[str, Any]]:
        hopping = {"step_ms": self.step_ms} if self.kind == "hopping" else {}
        window = {"kind": self.kind, "time": "event", "timestamp_column": "ts",
                  "size_ms": SIZE_MS, "allowed_lateness_ms": SIZE_MS, "idle_timeout_ms": 3000,
                  **hopping, **LATE[self.late]}
        return {"window": window, "aggregation": AGGREGATION}

    @property
    def step_ms(self) -> int:
        return STEPS_MS[self.kind]


def cell_input(rng: random.Random, *, late: bool) -> list[tuple[int, pa.Table]]:
    """Every worker writes its own partition (worker % 4), step by step in event time;
    with ``late``, every 10th step a worker also sends rows 2-3 windows back (within the
    revision lateness: they revise) or 6 windows back (beyond it: the late topic)."""
    batches, next_id = [], 0
    for step in range(STEPS):
        for worker in range(WORKERS):
            table = numbered(sensor_table(rng, rng.randrange(20, 50), T0 + step * STEP_MS,
                                          STEP_MS), next_id)
            next_id += table.num_rows
            batches.append((worker % INPUT_PARTITIONS, table))
        if late and step >= 50 and step % 10 == 0:
            back = rng.choice([2 * SIZE_MS, 3 * SIZE_MS, 6 * SIZE_MS])
            table = numbered(sensor_table(rng, 15, T0 + step * STEP_MS - back, STEP_MS),
                             next_id)
            next_id += table.num_rows
            batches.append((rng.randrange(INPUT_PARTITIONS), table))
    return batches


def reference(tables: list[pa.Table], cell: Cell, late: pl.DataFrame) -> pl.DataFrame:
    """DuckDB over every (row, window) the daemon did not send late: each row in each of
    its windows (hopping: size / step of them), the late pairs taken out."""
    rows = pa.concat_tables(tables)  # noqa: F841 - read by DuckDB's replacement scan
    late_rows = late.to_arrow()  # noqa: F841
    windows = SIZE_MS // cell.step_ms
    sql = f"""
        WITH windowed AS (
            SELECT rows.*, (epoch_ms(ts) // {cell.step_ms} - k) * {cell.step_ms} AS window_start
            FROM rows, range({windows}) AS r(k))
        SELECT window_start, site, sensor, "zone name",
               SUM(reading_sum) AS reading_sum, SUM(reading_count)::BIGINT AS reading_count,
               MIN(reading_min) AS reading_min, MAX(reading_max) AS reading_max,
               median(power) AS power, count(DISTINCT error_count)::BIGINT AS error_count,
               quantile_cont("δ_max", 0.9) AS "δ_max", COUNT(row_id)::BIGINT AS row_id,
               SUM(reading_sum) FILTER (WHERE reading_sum > 0) AS positive,
               COUNT(*)::BIGINT AS row_count
        FROM windowed ANTI JOIN late_rows USING (row_id, window_start)
        GROUP BY ALL
    """  # noqa: S608 - only integers are formatted in
    relation = duckdb.sql(sql)
    assert relation is not None
    return pl.DataFrame(relation.arrow()).sort(["window_start", *KEYS])


def subscribed(bootstrap: str, topic: str) -> pl.DataFrame:
    """What a subscriber holds after applying every committed revision: each window's
    latest whole form."""
    latest = {w.start_ms: w for w in read_output(bootstrap, topic, idle_timeout_s=3.0,
                                                 complete=True)}
    frame = pl.concat([w.frame for w in latest.values() if w.frame.height])
    return frame.with_columns(pl.col("window_start").dt.epoch("ms"), pl.col(KEYS).cast(
        pl.String)).drop("window_end", "revision", strict=False)


def churn(instances: Instances, publishing: PacedPublishing) -> dict[str, Any]:
    """1 -> 3 instances, a SIGKILL and restart, a stall past max.poll.interval.ms, a
    zombie fencing its elder, 3 -> 2; the fenced elder's exit and last line."""
    instances.start("a")
    time.sleep(2)
    instances.start("b")
    instances.start("c")
    time.sleep(1)
    instances.stop("b", signal.SIGKILL)
    instances.start("b")  # its id again: its open transaction is aborted at once
    stalled = instances.running["c"]
    stalled.send_signal(signal.SIGSTOP)
    time.sleep(STALL_S)
    stalled.send_signal(signal.SIGCONT)
    instances.start("zombie-maker", instance_id="a")  # a second "a": fences the first
    elder = instances.running.pop("a")
    elder_exit = elder.wait(FENCED_EXIT_S)
    publishing.finish()
    instances.stop("c", signal.SIGTERM)
    return {"elder_exit": elder_exit,
            "elder_line": instances.log("a").read_text().strip().splitlines()[-1]}


@pytest.mark.parametrize("cell", [Cell(kind, late) for kind in STEPS_MS for late in LATE],
                         ids=lambda c: f"{c.kind}-{c.late}")
def test_every_feature_scales_out_exactly(
    bootstrap: str, topic_factory: TopicFactory, tmp_path: Path, cell: Cell,
) -> None:
    topics = make_topics(topic_factory)
    data = cell_input(random.Random(33), late=cell.late == "revise")
    instances = Instances(tmp_path, bootstrap, topics, sections=cell.sections)
    publisher = DurablePublisher(bootstrap, topics["input"])
    try:
        publishing = PacedPublishing(publisher, data, pause_s=0.02)
        churned = churn(instances, publishing)
        publisher.flush()
        wait_all_windows(bootstrap, topics, data, step_ms=cell.step_ms)
        instances.stop_all()
    finally:
        instances.kill_all()
    late = late_pairs(bootstrap, topics["late"])
    got = subscribed(bootstrap, topics["output"])
    updates = sum(1 for w in read_output(bootstrap, topics["output"], idle_timeout_s=1.0)
                  if w.kind == "update")
    expected = reference([t for _, t in data], cell, late)
    window_keys = ["window_start", *KEYS]
    figures = {
        "cell": f"{cell.kind}/{cell.late}", "input_rows": sum(t.num_rows for _, t in data),
        "windows": expected["window_start"].n_unique(), "output_rows": got.height,
        "reference_rows": expected.height, "late_pairs": late.height,
        "update_messages": updates,
        "duplicates": got.group_by(window_keys).len().filter(pl.col("len") > 1).height,
        "lost": expected.join(got, on=window_keys, how="anti").height,
        "exit_codes": instances.exits, **churned,
    }
    write_figures(f"scale_out_matrix_{cell.kind}_{cell.late}", figures)
    assert figures["duplicates"] == 0
    if cell.late == "revise":  # late rows revised emitted windows, and went late beyond
        assert updates > 0
        assert late.height > 0
    assert churned["elder_exit"] == 1
    assert "fenced" in churned["elder_line"]
    assert all(code in (0, -signal.SIGKILL) for code in instances.exits)
    assert_frame_equal(got.select(expected.columns).sort(window_keys), expected,
                       check_exact=False, rel_tol=1e-9, abs_tol=1e-9, check_dtypes=False)


@pytest.mark.parametrize(("aggregation", "late"), [("merging", "topic"),
                                                   ("holistic", "topic"),
                                                   ("holistic", "revise")])
def test_session_windows_scale_out_exactly(
    bootstrap: str, topic_factory: TopicFactory, tmp_path: Path, aggregation: str,
    late: str,
) -> None:
    """``holistic``: median, quantile, n_unique and an expression (with counts and means
    that merge), over the values stage 1 sends with its partial sessions. ``revise``: rows
    behind sessions that went out revise them; a subscriber applies every revision."""
    sections, aggregates = SESSION_PLANS[aggregation]
    sections = {**sections, "window": {**sections["window"], **LATE[late]}}
    topics = make_topics(topic_factory)
    data, far = session_cell_input(random.Random(35), revise=late == "revise")
    rows = pa.concat_tables([t for _, t in data])
    last_end = int(pl.DataFrame(rows).select(pl.col("ts").dt.epoch("ms").max()).item()) + GAP_MS
    instances = Instances(tmp_path, bootstrap, topics, sections=sections)
    publisher = DurablePublisher(bootstrap, topics["input"])
    started = time.monotonic()
    try:
        publishing = PacedPublishing(publisher, data, pause_s=0.02)
        churned = churn(instances, publishing)
        publisher.flush()
        # Every partition idle: every session out, every part's marker past the last.
        wait_until(lambda: (t := session_frontiers(bootstrap, topics["output"])) and len(t)
                   == REPARTITIONS and min(t.values()) >= last_end,
                   timeout_s=120, what="every part's frontier past the last session")
        if late == "revise":  # the stream over, rows behind sessions kept for revisions
            behind = after_the_end(rows, max(rows.column("row_id").to_pylist()) + 1)
            before = held_rows(bootstrap, topics["output"])
            publisher.publish(0, behind)
            publisher.flush()
            rows = pa.concat_tables([rows, behind])
            # Updates may have gone out while publishing already: wait for these rows'.
            wait_until(lambda: held_rows(bootstrap, topics["output"])
                       >= before + behind.num_rows,
                       timeout_s=60, what="the updates the rows behind make")
        instances.stop_all()
    finally:
        instances.kill_all()
    late_rows = late_pairs(bootstrap, topics["late"])
    late_ids = set(late_rows.get_column("row_id").to_list())
    got, updates = held_sessions(bootstrap, topics["output"])
    kept = rows.filter(pa.array([i not in late_ids for i in rows.column("row_id").to_pylist()]))
    expected = session_reference([kept], GAP_MS, aggregates)
    session_keys = ["window_start", *KEYS]
    figures = {
        "cell": f"session/{late}/{aggregation}", "input_rows": rows.num_rows,
        "sessions": expected.height, "update_rows": updates,
        "output_rows": got.height, "late_rows": len(late_ids), "far_behind_rows": len(far),
        "duplicates": got.group_by(session_keys).len().filter(pl.col("len") > 1).height,
        "lost": expected.join(got, on=session_keys, how="anti").height,
        "exit_codes": instances.exits, "seconds": round(time.monotonic() - started, 1),
        **churned,
    }
    write_figures(f"scale_out_matrix_session_{late}_{aggregation}", figures)
    assert late_ids == far, "exactly the rows far behind are late, each once"
    assert late_rows.height == len(far)
    assert figures["duplicates"] == 0
    assert (updates > 0) == (late == "revise"), "revisions, and only under late: revise"
    assert int(got.get_column("row_count").sum()) + len(late_ids) == rows.num_rows
    assert churned["elder_exit"] == 1
    assert "fenced" in churned["elder_line"]
    assert all(code in (0, -signal.SIGKILL) for code in instances.exits)
    assert_frame_equal(got.select(expected.columns).sort(session_keys), expected.sort(
        session_keys), check_exact=False, rel_tol=1e-9, abs_tol=1e-9, check_dtypes=False)

