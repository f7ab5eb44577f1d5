"""Both stages of the scale-out, two instances on the in-memory broker: input keyed by
worker (every partition holds every group), output one row per (window, keys), and each
window closed by one end-of-window marker per repartition partition."""

from __future__ import annotations

import random
from collections.abc import Sequence

import duckdb
import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

from consumer.compose import build_two_stages
from consumer.config import settings_from_dict
from consumer.kafka.processor import StreamProcessor
from tests.consumer.kafka.fake_broker import FakeBroker, FakeConsumer, FakeSink
from tests.consumer.kafka.rig import Clock
from wire.complete import WindowAssembler
from wire.input import decode_ipc_stream, encode_ipc_stream
from wire.output import OutputWindow, WindowEnd, decode_message

SOURCE, REPARTITION, SINK, LATE = "in", "rep", "out", "late"
INPUTS, PARTS = 4, 3
SIZE_MS = 1_000
SITES = [f"site-{i}" for i in range(7)]


Sections = dict[str, dict[str, object]]


def settings(instance: str, sections: Sections | None = None) -> dict[str, object]:
    """The instances' configuration; ``sections`` are merged into its sections."""
    data: dict[str, dict[str, object]] = {
        "kafka": {"bootstrap_servers": "fake:9092", "group_id": "g"},
        "input": {"topics": [SOURCE]},
        "output": {"topic": SINK},
        "window": {"kind": "tumbling", "time": "event", "timestamp_column": "ts",
                   "size_ms": SIZE_MS, "idle_timeout_ms": 2_000},
        "processing": {"instance_id": instance, "commit_interval_ms": 300},
        "scale_out": {"repartition_topic": REPARTITION, "partitions": PARTS},
    }
    for name, values in (sections or {}).items():
        data[name] = {**data.get(name, {}), **values}
    return dict(data)


class Instance:
    def __init__(self, broker: FakeBroker, name: str, clock: Clock,
                 sections: Sections | None = None) -> None:
        config = settings_from_dict(settings(name, sections))
        self.consumer = FakeConsumer(broker)
        partitions = {(SOURCE, p) for p in range(INPUTS)}
        self.processor = StreamProcessor(
            self.consumer, FakeSink(broker), build_two_stages(config, partitions),
            topics=[SOURCE, REPARTITION], processing=config.processing, clock=clock)
        self.processor.subscribe()


def run_turns(clock: Clock, instances: Sequence[Instance], turns: int) -> None:
    """``turns`` times: each instance turns once, then 100 ms pass."""
    for _ in range(turns):
        for instance in instances:
            instance.processor.run_once()
        clock.now_ms += 100


def batch(rng: random.Random, start_ms: int, rows: int) -> pa.Table:
    return pa.table({
        "site": [rng.choice(SITES) for _ in range(rows)],
        "ts": pa.array([start_ms + rng.randrange(SIZE_MS // 2) for _ in range(rows)],
                       pa.timestamp("ms", "UTC")),
        "reading": [rng.uniform(-10, 10) for _ in range(rows)],
        "reading_max": [rng.uniform(0, 100) for _ in range(rows)],
        "code": [rng.randrange(8) for _ in range(rows)],
    })


def run_two_instances(sections: Sections | None = None, *, crash_b_at: int | None = None,
                      ) -> tuple[FakeBroker, list[pa.Table]]:
    """Instances a (input 0, 1; repartition 0) and b (input 2, 3; repartition 1, 2) over
    six windows of every group on every partition, run until every window is out.
    ``crash_b_at``: at that turn b dies (nothing uncommitted survives) and a new b takes
    its partitions from their commits."""
    broker = FakeBroker()
    broker.create_topic(SOURCE, INPUTS)
    broker.create_topic(REPARTITION, PARTS)
    broker.create_topic(SINK)
    clock = Clock()
    a, b = Instance(broker, "a", clock, sections), Instance(broker, "b", clock, sections)
    a.consumer.rebalance("assign", [(SOURCE, 0), (SOURCE, 1), (REPARTITION, 0)])
    b.consumer.rebalance("assign", [(SOURCE, 2), (SOURCE, 3), (REPARTITION, 1),
                                    (REPARTITION, 2)])
    rng = random.Random(4)
    sent = []
    for window in range(6):  # every worker writes every group, in event-time order
        for partition in range(INPUTS):
            table = batch(rng, window * SIZE_MS, 50)
            sent.append(table)
            broker.produce(SOURCE, partition, encode_ipc_stream(table))
    for turn in range(80):  # until every partition has been idle long enough to close all
        if turn == crash_b_at:
            b = Instance(broker, "b", clock, sections)
            b.consumer.rebalance("assign", [(SOURCE, 2), (SOURCE, 3), (REPARTITION, 1),
                                            (REPARTITION, 2)])
        a.processor.run_once()
        b.processor.run_once()
        clock.now_ms += 100
    return broker, sent


def output_rows(broker: FakeBroker, *, final: bool = True) -> pl.DataFrame:
    """Every result row on the output topic, window_start in epoch ms, keys as text."""
    messages = [decode_message(m.value(), m.headers()) for m in broker.topics[SINK][0]]
    data = [m for m in messages if isinstance(m, OutputWindow)]
    assert all(w.part is not None for w in data)
    assert all(w.final for w in data) == final
    return pl.concat([w.frame for w in data]).with_columns(
        pl.col("window_start").dt.epoch("ms"), pl.col("site").cast(pl.String)
    ).drop("window_end")


def test_aggregates_that_need_the_values_are_finished_by_stage_two() -> None:
    broker, sent = run_two_instances({"aggregation": {
        "columns": {"reading": "median", "reading_max": {"quantile": 0.9}, "code": "n_unique"},
        "expressions": {"positive": "pl.col('reading').filter(pl.col('reading') > 0).sum()"}}})
    got = output_rows(broker)
    rows = pa.concat_tables(sent)  # noqa: F841 - read by DuckDB
    relation = duckdb.sql(f"""
        SELECT epoch_ms(ts) // {SIZE_MS} * {SIZE_MS} AS window_start, site,
               median(reading) AS reading, quantile_cont(reading_max, 0.9) AS reading_max,
               count(DISTINCT code)::BIGINT AS code,
               sum(reading) FILTER (WHERE reading > 0) AS positive,
               count(*)::BIGINT AS row_count
        FROM rows GROUP BY ALL ORDER BY window_start, site""")  # noqa: S608
    assert relation is not None
    expected = pl.from_arrow(relation.arrow())
    assert isinstance(expected, pl.DataFrame)
    columns = ["window_start", "site", "reading", "reading_max", "code", "positive",
               "row_count"]
    assert_frame_equal(got.select(columns).sort("window_start", "site"),
                       expected.select(columns), check_exact=False, rel_tol=1e-9,
                       check_dtypes=False)


def test_two_instances_emit_each_group_once_and_every_window_whole() -> None:
    broker, sent = run_two_instances()
    messages = [decode_message(m.value(), m.headers()) for m in broker.topics[SINK][0]]
    data = [m for m in messages if isinstance(m, OutputWindow)]
    ends = [m for m in messages if isinstance(m, WindowEnd)]
    got = pl.concat([w.frame for w in data]).with_columns(
        pl.col("window_start").dt.epoch("ms")).drop("window_end")
    rows = pl.concat([pl.DataFrame(t) for t in sent])
    expected = rows.group_by(
        (pl.col("ts").dt.epoch("ms") // SIZE_MS * SIZE_MS).alias("window_start"), "site",
    ).agg(pl.col("reading").sum(), pl.col("reading_max").max(),
          pl.len().cast(pl.Int64).alias("row_count"))
    columns = ["window_start", "site", "reading", "reading_max", "row_count"]
    assert_frame_equal(got.select(columns).with_columns(pl.col("site").cast(pl.String))
                       .sort("window_start", "site"),
                       expected.select(columns).sort("window_start", "site"),
                       check_exact=False, rel_tol=1e-9)
    assert all(w.final and w.part is not None for w in data)
    by_window: dict[int, list[WindowEnd]] = {}
    for end in ends:
        by_window.setdefault(end.start_ms, []).append(end)
    assert sorted(by_window) == [w * SIZE_MS for w in range(6)]
    for start, parts in by_window.items():
        assert sorted(e.part for e in parts) == [(k, PARTS) for k in range(1, PARTS + 1)]
        assert sum(e.rows for e in parts) == got.filter(pl.col("window_start") == start).height
        assert sum(e.input_rows for e in parts) == 4 * 50


@pytest.mark.parametrize("crash_b_at", [None, 1, 2])
def test_stage_two_over_its_budget_emits_early_revisions_that_add_up(
    crash_b_at: int | None,
) -> None:
    """Stage 2 cannot pause (its windows complete only once the progress records behind
    their partials are read): over input.max_groups it sends its parts early, as delta
    revisions, and each part's end-of-window marker counts them, across a crash too
    (the commit metadata keeps the numbering and the counts)."""
    broker, sent = run_two_instances(
        {"input": {"max_groups": 12, "over_budget": "emit_early"}}, crash_b_at=crash_b_at)
    got = output_rows(broker, final=False)
    windows = []
    assembler = WindowAssembler()
    for m in broker.topics[SINK][0]:
        whole = assembler.add(decode_message(m.value(), m.headers()))
        if whole is not None:
            windows.append(whole)
    assert assembler.pending() == []
    assert sorted(w.start_ms for w in windows) == [w * SIZE_MS for w in range(6)]
    added_up = pl.concat([w.frame for w in windows]).with_columns(
        pl.col("window_start").dt.epoch("ms"), pl.col("site").cast(pl.String)).group_by(
        "window_start", "site").agg(pl.col("reading").sum(), pl.col("reading_max").max(),
                                    pl.col("row_count").sum())
    rows = pl.concat([pl.DataFrame(t) for t in sent])
    expected = rows.group_by(
        (pl.col("ts").dt.epoch("ms") // SIZE_MS * SIZE_MS).alias("window_start"), "site",
    ).agg(pl.col("reading").sum(), pl.col("reading_max").max(),
          pl.len().cast(pl.Int64).alias("row_count"))
    assert got.height > expected.height, "some parts went out in several revisions"
    assert_frame_equal(added_up.sort("window_start", "site"),
                       expected.sort("window_start", "site"), check_exact=False,
                       rel_tol=1e-9, check_column_order=False)


def assembled(broker: FakeBroker) -> pl.DataFrame:
    """The output as a subscriber holds it after applying every revision: each window's
    latest whole form (wire/complete.py)."""
    latest: dict[int, OutputWindow] = {}
    assembler = WindowAssembler()
    for m in broker.topics[SINK][0]:
        whole = assembler.add(decode_message(m.value(), m.headers()))
        if whole is not None:
            latest[whole.start_ms] = whole
    assert assembler.pending() == []
    return pl.concat([w.frame for w in latest.values()]).with_columns(
        pl.col("window_start").dt.epoch("ms"), pl.col("site").cast(pl.String))


def test_late_rows_revise_the_windows_stage_two_emitted_and_later_ones_are_late() -> None:
    """late: revise through both stages: stage 1 sends late rows of windows within
    revision_lateness_ms of its frontier as partials; stage 2, which kept the window,
    merges them and sends the changed groups as the part's next revision. Rows later than
    that go to the late topic from stage 1."""
    sections: Sections = {
        "window": {"late": "revise", "revision_lateness_ms": 2_500},
        "output": {"late_topic": LATE}}
    broker = FakeBroker()
    for topic, partitions in ((SOURCE, INPUTS), (REPARTITION, PARTS), (SINK, 1), (LATE, 1)):
        broker.create_topic(topic, partitions)
    clock = Clock()
    a, b = Instance(broker, "a", clock, sections), Instance(broker, "b", clock, sections)
    a.consumer.rebalance("assign", [(SOURCE, 0), (SOURCE, 1), (REPARTITION, 0)])
    b.consumer.rebalance("assign", [(SOURCE, 2), (SOURCE, 3), (REPARTITION, 1),
                                    (REPARTITION, 2)])
    rng = random.Random(9)
    sent: list[pa.Table] = []

    def publish(partition: int, table: pa.Table) -> None:
        sent.append(table)
        broker.produce(SOURCE, partition, encode_ipc_stream(table))

    for window in range(5):
        for partition in range(INPUTS):
            publish(partition, batch(rng, window * SIZE_MS, 30))
    run_turns(clock, (a, b), 10)  # windows 0-3 out (window 4 holds the frontiers at 4000)
    revising = [batch(rng, 3 * SIZE_MS, 5), batch(rng, 2 * SIZE_MS, 5)]
    too_late = batch(rng, 0, 7)  # window 0 ends 1000: 2500 before the frontier, or more
    publish(0, revising[0])
    publish(3, revising[1])
    publish(2, too_late)
    run_turns(clock, (a, b), 80)

    rows = pl.concat([pl.DataFrame(t) for t in sent[:-1]])  # all but the late rows
    expected = rows.group_by(
        (pl.col("ts").dt.epoch("ms") // SIZE_MS * SIZE_MS).alias("window_start"), "site",
    ).agg(pl.col("reading").sum(), pl.col("reading_max").max(),
          pl.len().cast(pl.Int64).alias("row_count"))
    columns = ["window_start", "site", "reading", "reading_max", "row_count"]
    assert_frame_equal(assembled(broker).select(columns).sort("window_start", "site"),
                       expected.select(columns).sort("window_start", "site"),
                       check_exact=False, rel_tol=1e-9)
    messages = [decode_message(m.value(), m.headers()) for m in broker.topics[SINK][0]]
    updates = [m for m in messages if isinstance(m, OutputWindow) and m.kind == "update"]
    assert {u.start_ms for u in updates} == {2 * SIZE_MS, 3 * SIZE_MS}
    assert all(u.part is not None and u.revision >= 1 for u in updates)
    late_rows = sum(pl.DataFrame(decode_ipc_stream(m.value())).height
                    for m in broker.topics[LATE][0])
    assert late_rows == too_late.num_rows


def test_early_results_through_both_stages_grow_to_the_final_window() -> None:
    """window.emit_every_ms with the scale-out: stage 1 sends its state on that often,
    stage 2 tells each part's changed groups as provisional revisions; a group's count
    only grows from one to the next, up to the final window, which equals the reference."""
    broker, sent = run_two_instances({"window": {"emit_every_ms": 200}})
    messages = [decode_message(m.value(), m.headers()) for m in broker.topics[SINK][0]]
    provisional = [m for m in messages if isinstance(m, OutputWindow) and not m.final]
    assert provisional
    assert all(m.kind == "update" and m.part is not None for m in provisional)
    final = assembled(broker)
    rows = pl.concat([pl.DataFrame(t) for t in sent])
    expected = rows.group_by(
        (pl.col("ts").dt.epoch("ms") // SIZE_MS * SIZE_MS).alias("window_start"), "site",
    ).agg(pl.col("reading").sum(), pl.col("reading_max").max(),
          pl.len().cast(pl.Int64).alias("row_count"))
    columns = ["window_start", "site", "reading", "reading_max", "row_count"]
    assert_frame_equal(final.select(columns).sort("window_start", "site"),
                       expected.select(columns).sort("window_start", "site"),
                       check_exact=False, rel_tol=1e-9)
    counts: dict[tuple[int, str], list[int]] = {}
    for message in provisional:
        for site, count in message.frame.select(pl.col("site").cast(pl.String),
                                                "row_count").iter_rows():
            counts.setdefault((message.start_ms, site), []).append(count)
    finals = {(int(s), str(k)): int(n) for s, k, n in
              final.select("window_start", "site", "row_count").iter_rows()}
    for group, seen in counts.items():
        assert seen == sorted(seen), f"{group}: a provisional count went down: {seen}"
        assert seen[-1] <= finals[group]


def test_an_idle_partition_with_rows_in_open_windows_holds_stage_two_back() -> None:
    """An instance owns a partition gone idle and one just taken over, whose frontier its
    former owner had moved past the last window: the new one is not idle yet, so the
    instance's watermark stands and the idle partition's rows of that window are still
    open here, unsent. Its progress record must not tell stage 2 the partition is idle
    (stage 2 then leaves its frontier out): the window would go out without those rows,
    and they would follow as late partials (seen in the rebalance storm's last windows)."""
    sections: Sections = {"output": {"late_topic": LATE}}
    broker = FakeBroker()
    for topic, partitions in ((SOURCE, INPUTS), (REPARTITION, PARTS), (SINK, 1), (LATE, 1)):
        broker.create_topic(topic, partitions)
    clock = Clock()
    a, b = Instance(broker, "a", clock, sections), Instance(broker, "b", clock, sections)
    a.consumer.rebalance("assign", [(SOURCE, 0), (SOURCE, 1), (SOURCE, 2),
                                    *((REPARTITION, k) for k in range(PARTS))])
    rng = random.Random(5)
    sent = []
    for window in range(4):
        for partition in range(INPUTS):
            table = batch(rng, window * SIZE_MS, 20)
            sent.append(table)
            broker.produce(SOURCE, partition, encode_ipc_stream(table))

    # a's partitions idle: a sends every window; stage 2 waits for input 3
    run_turns(clock, (a, b), 30)
    b.consumer.rebalance("assign", [(SOURCE, 3)])
    # b reads input 3: its last window stays open on b's watermark
    run_turns(clock, (a, b), 5)
    a.consumer.rebalance("revoke", [(SOURCE, 0)])
    b.consumer.rebalance("assign", [(SOURCE, 0)])  # done through the end, not idle on b yet
    run_turns(clock, (a, b), 40)

    assert broker.topics[LATE][0] == [], "a window went out before input 3's partials"
    rows = pl.concat([pl.DataFrame(t) for t in sent])
    expected = rows.group_by(
        (pl.col("ts").dt.epoch("ms") // SIZE_MS * SIZE_MS).alias("window_start"), "site",
    ).agg(pl.col("reading").sum(), pl.len().cast(pl.Int64).alias("row_count"))
    columns = ["window_start", "site", "reading", "row_count"]
    assert_frame_equal(output_rows(broker).select(columns).sort("window_start", "site"),
                       expected.select(columns).sort("window_start", "site"),
                       check_exact=False, rel_tol=1e-9)
