"""window.late: revise in the time engine: late rows within revision_lateness_ms revise
their window's groups, later ones are late; kept state is rebuilt by a replay after a
restart without emitting a revision twice, and revision numbers carry on. Results are
checked against DuckDB over the rows each window holds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import duckdb
import polars as pl
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from consumer.core.offsets import CommitPoint
from consumer.core.plan import AggregationPlan, derive_plan
from consumer.core.types import ClosedWindow, MessageRef, PartitionKey
from consumer.core.windows.bounds import WindowSpec
from consumer.core.windows.time.engine import TimeWindowEngine

P0: PartitionKey = ("events", 0)
P1: PartitionKey = ("events", 1)
UTC_MS = pl.Datetime("ms", "UTC")
SIZE_MS = 1_000
WITHIN_MS = 2_000
SCHEMA = pa.schema([("k", pa.string()), ("ts", pa.timestamp("ms", "UTC")),
                    ("v", pa.float64()), ("lat", pa.float64())])
PLAN = derive_plan(SCHEMA, time_column="ts", keys=["k"],
                   overrides={"v": "sum", "lat": "median"})
SQL = f"""SELECT (epoch_ms(ts) // {SIZE_MS}) * {SIZE_MS} AS window_start, k,
                 sum(v) AS v, median(lat) AS lat, count(*) AS row_count
          FROM rows GROUP BY ALL ORDER BY ALL"""  # noqa: S608 - integers only

Row = tuple[str | None, int, float, float]


def engine(plan: AggregationPlan = PLAN, within_ms: int = WITHIN_MS) -> TimeWindowEngine:
    return TimeWindowEngine(plan, WindowSpec.tumbling(SIZE_MS), event_time=True,
                            time_dtype=UTC_MS, allowed_lateness_ms=0, idle_timeout_ms=60_000,
                            merge_every=2, revise_within_ms=within_ms)


def table(rows: Sequence[Row]) -> pa.Table:
    columns = [[row[i] for row in rows] for i in range(len(SCHEMA))]
    return pa.table(dict(zip(SCHEMA.names, columns, strict=True)), schema=SCHEMA)


def reference(rows: Sequence[Row]) -> pl.DataFrame:
    data = table(rows)  # noqa: F841 - read by DuckDB's replacement scan
    relation = duckdb.sql(SQL.replace("FROM rows", "FROM data"))
    assert relation is not None
    return pl.DataFrame(relation.arrow()).sort("window_start", "k")


@dataclass
class Stream:
    """Messages per partition, fed in order, with what the engine emitted."""

    engine: TimeWindowEngine
    log: dict[PartitionKey, list[list[Row]]] = field(default_factory=dict)
    emitted: list[ClosedWindow] = field(default_factory=list)
    late: list[pl.DataFrame] = field(default_factory=list)

    def send(self, partition: PartitionKey, rows: list[Row], now_ms: int = 0) -> None:
        self.log.setdefault(partition, []).append(rows)
        self.feed(partition, len(self.log[partition]) - 1, rows, now_ms)

    def feed(self, partition: PartitionKey, offset: int, rows: list[Row], now_ms: int) -> None:
        times = [r[1] for r in rows]
        ref = MessageRef(partition, offset, len(rows), min(times), max(times))
        late = self.engine.add(pl.DataFrame(table(rows)), [ref], now_ms)
        if late is not None:
            self.late.append(late)

    def flush(self, now_ms: int = 0) -> list[ClosedWindow]:
        out = self.engine.close_due(now_ms)
        self.emitted += out
        return out

    def commit(self) -> dict[PartitionKey, CommitPoint]:
        points = self.engine.commit_points()
        assert points is not None
        return points


def as_reference(window: ClosedWindow) -> pl.DataFrame:
    return window.frame.drop("window_end").with_columns(
        pl.col("window_start").dt.epoch("ms")).sort("k")


def latest(emitted: Sequence[ClosedWindow]) -> pl.DataFrame:
    """Each (window, keys) row of its latest revision, as a subscriber keeps them."""
    rows = [as_reference(w).with_columns(pl.lit(w.revision).alias("__rev")) for w in emitted]
    frame = pl.concat(rows).sort("__rev")
    return frame.unique(["window_start", "k"], keep="last").drop("__rev").sort(
        "window_start", "k")


def test_a_late_row_within_the_bound_revises_only_its_group() -> None:
    stream = Stream(engine())
    stream.engine.assign(P0, None, None, 0)
    on_time: list[Row] = [("a", 100, 1.0, 1.0), ("b", 200, 2.0, 5.0), ("a", 1_500, 4.0, 2.0)]
    stream.send(P0, on_time)
    (first,) = stream.flush()
    assert (first.revision, first.kind, first.final) == (0, "full", True)
    stream.send(P0, [("a", 300, 8.0, 9.0)])  # late for [0, 1000), within 2 s
    assert stream.late == []
    (revision,) = stream.flush()
    assert (revision.start_ms, revision.revision, revision.kind) == (0, 1, "update")
    everything = [*on_time, ("a", 300, 8.0, 9.0)]
    assert_frame_equal(as_reference(revision), reference(everything).filter(
        (pl.col("window_start") == 0) & (pl.col("k") == "a")), check_dtypes=False)
    assert revision.input_rows == 3  # the whole window's rows
    assert stream.flush() == []  # nothing changed since


def test_late_rows_of_a_window_that_never_went_out_are_its_first_full_revision() -> None:
    stream = Stream(engine())
    stream.engine.assign(P0, None, None, 0)
    stream.send(P0, [("a", 2_100, 1.0, 1.0)])
    stream.send(P0, [("b", 3_050, 1.0, 1.0)])
    stream.flush()  # watermark 3050: [2000, 3000) out; [1000, 2000) never had a row
    late_rows: list[Row] = [("a", 1_200, 2.0, 3.0), ("b", 1_900, 4.0, 5.0)]
    stream.send(P0, late_rows)  # within the bound: [1000, 2000) ends 1 s behind
    (window,) = stream.flush()
    assert (window.start_ms, window.revision, window.kind) == (1_000, 0, "full")
    assert_frame_equal(as_reference(window), reference(late_rows), check_dtypes=False)
    stream.send(P0, [("a", 1_300, 1.0, 1.0)])
    (update,) = stream.flush()
    assert (update.revision, update.kind, update.frame["k"].to_list()) == (1, "update", ["a"])


def test_revisions_number_on_and_one_flush_gathers_a_windows_changes() -> None:
    stream = Stream(engine())
    stream.engine.assign(P0, None, None, 0)
    stream.send(P0, [("a", 100, 1.0, 1.0), ("b", 1_100, 1.0, 1.0)])
    stream.flush()
    stream.send(P0, [("a", 200, 1.0, 1.0)])
    stream.send(P0, [("b", 300, 1.0, 1.0)])
    (second,) = stream.flush()
    assert second.revision == 1
    assert sorted(second.frame["k"].to_list()) == ["a", "b"]
    stream.send(P0, [("a", 400, 1.0, 1.0)])
    (third,) = stream.flush()
    assert (third.revision, third.frame["k"].to_list()) == (2, ["a"])


def test_rows_past_the_bound_are_late_and_the_state_is_dropped() -> None:
    stream = Stream(engine())
    stream.engine.assign(P0, None, None, 0)
    stream.send(P0, [("a", 100, 1.0, 1.0), ("a", 2_999, 1.0, 1.0)])
    stream.flush()  # watermark 2999: [0, 1000) ends 2 s before 3000
    assert stream.engine.cardinality() == 2  # kept [0, 1000) and open [2000, 3000)
    stream.send(P0, [("a", 3_000, 1.0, 1.0)])
    stream.flush()  # watermark 3000 = end + 2 s: [0, 1000) is no longer kept
    stream.send(P0, [("a", 500, 1.0, 1.0)])
    assert [late.height for late in stream.late] == [1]
    assert stream.flush() == []


def test_a_restart_replays_kept_windows_without_revising_them_again() -> None:
    before = Stream(engine())
    before.engine.assign(P0, None, None, 0)
    before.send(P0, [("a", 100, 1.0, 1.0), ("b", 200, 2.0, 2.0)])
    before.send(P0, [("a", 1_500, 4.0, 3.0)])
    before.flush()  # [0, 1000) out as revision 0
    before.send(P0, [("a", 300, 8.0, 4.0)])
    before.flush()  # revision 1
    before.send(P0, [("a", 350, 16.0, 5.0)])
    before.flush()  # revision 2
    point = before.commit()[P0]
    assert point.offset == 0  # the kept window's first message
    assert point.metadata.retention is not None
    assert point.metadata.retention.revisions == ((0, 2),)

    after = Stream(engine())  # a crash: a new process, the same committed offsets
    after.engine.assign(P0, point.offset, point.metadata, 0)
    for offset, rows in enumerate(before.log[P0][point.offset:], start=point.offset):
        after.feed(P0, offset, rows, 0)
    assert after.flush() == []  # the replay rebuilt [0, 1000); nothing is due again
    assert after.late == []
    after.log = {P0: list(before.log[P0])}
    after.send(P0, [("b", 400, 32.0, 6.0)])
    (revision,) = after.flush()
    assert (revision.revision, revision.frame["k"].to_list()) == (3, ["b"])
    everything = [row for rows in after.log[P0] for row in rows]
    assert_frame_equal(latest([*before.emitted, revision]),
                       reference(everything).filter(pl.col("window_start") == 0),
                       check_dtypes=False)


def test_revisions_wait_until_every_partition_has_replayed() -> None:
    before = Stream(engine())
    for partition in (P0, P1):
        before.engine.assign(partition, None, None, 0)
    before.send(P0, [("a", 100, 1.0, 1.0)])
    before.send(P1, [("a", 200, 2.0, 2.0)])
    before.send(P0, [("a", 1_500, 1.0, 1.0)])
    before.send(P1, [("a", 1_600, 1.0, 1.0)])
    before.flush()
    points = before.commit()

    after = Stream(engine())
    for partition in (P0, P1):
        after.engine.assign(partition, points[partition].offset, points[partition].metadata, 0)
    after.log = {p: list(rows) for p, rows in before.log.items()}
    for offset, rows in enumerate(before.log[P0]):
        after.feed(P0, offset, rows, 0)
    after.send(P0, [("a", 300, 4.0, 3.0)])  # P0 is done replaying; P1 has not begun
    assert after.flush() == []
    assert after.engine.commit_points() is None  # holding: no commit may happen
    for offset, rows in enumerate(before.log[P1]):
        after.feed(P1, offset, rows, 0)
    (revision,) = after.flush()
    assert revision.revision == 1
    assert revision.frame["v"].to_list() == [7.0]  # P1's replayed 2.0 is in it
    assert after.engine.commit_points() is not None


def test_kept_windows_of_partitions_no_longer_all_here_are_not_revised() -> None:
    before = Stream(engine())
    for partition in (P0, P1):
        before.engine.assign(partition, None, None, 0)
    before.send(P0, [("a", 100, 1.0, 1.0), ("a", 1_500, 1.0, 1.0)])
    before.send(P1, [("a", 200, 1.0, 1.0), ("a", 1_600, 1.0, 1.0)])
    before.flush()
    point = before.commit()[P0]

    after = Stream(engine())  # P1 went to another instance: [0, 1000) cannot be rebuilt
    after.engine.assign(P0, point.offset, point.metadata, 0)
    for offset, rows in enumerate(before.log[P0]):
        after.feed(P0, offset, rows, 0)
    after.feed(P0, 1, [("a", 300, 1.0, 1.0)], 0)
    assert [late.height for late in after.late] == [1]  # late, not a revision
    assert after.flush() == []


def test_a_partition_added_to_the_owners_keeps_their_windows_revisable() -> None:
    before = Stream(engine())
    before.engine.assign(P0, None, None, 0)
    before.send(P0, [("a", 100, 1.0, 1.0), ("a", 1_500, 1.0, 1.0)])
    before.flush()
    point = before.commit()[P0]

    after = Stream(engine())  # P0 and a partition new to this instance
    after.engine.assign(P0, point.offset, point.metadata, 0)
    after.engine.assign(P1, None, None, 0)
    for offset, rows in enumerate(before.log[P0]):
        after.feed(P0, offset, rows, 0)
    after.feed(P0, 1, [("a", 300, 2.0, 1.0)], 0)
    assert after.late == []
    (revision,) = after.flush()
    assert (revision.revision, revision.frame["v"].to_list()) == (1, [3.0])


def test_the_memory_budget_sends_pending_revisions_then_drops_kept_windows() -> None:
    stream = Stream(engine())
    stream.engine.assign(P0, None, None, 0)
    stream.send(P0, [("a", 100, 1.0, 1.0), ("a", 1_500, 1.0, 1.0)])
    stream.flush()
    stream.send(P0, [("a", 200, 1.0, 1.0)])
    early = stream.engine.emit_early(0)
    assert [(w.start_ms, w.kind, w.final) for w in early] == [
        (1_000, "delta", False), (0, "update", True)]
    stream.send(P0, [("a", 300, 1.0, 1.0)])
    assert [late.height for late in stream.late] == [1]
    point = stream.commit()[P0]
    assert point.metadata.retention is not None
    assert point.metadata.retention.through == point.metadata.frontier


def test_holistic_aggregates_are_revised_from_the_kept_values() -> None:
    stream = Stream(engine())
    stream.engine.assign(P0, None, None, 0)
    rows: list[Row] = [("a", 100, 1.0, 1.0), ("a", 200, 1.0, 10.0), ("a", 1_100, 1.0, 1.0)]
    stream.send(P0, rows)
    stream.flush()
    stream.send(P0, [("a", 300, 1.0, 100.0)])
    (revision,) = stream.flush()
    assert revision.frame["lat"].to_list() == [10.0]  # median of 1, 10, 100


# -- any split, any lateness ----------------------------------------------------------

times = st.integers(0, 7_999)
rows_strategy = st.lists(st.tuples(st.sampled_from(["a", "b", None]), times,
                                   st.integers(-4, 4).map(float),
                                   st.integers(-100, 100).map(float)),
                         min_size=1, max_size=40)


@dataclass
class Run:
    """One partition's messages through an engine that commits, crashes and restarts
    like the daemon: a flush's output counts once committed; a crash loses what was not,
    and a new engine replays from the committed offset."""

    log: list[list[Row]] = field(default_factory=list)
    engine: TimeWindowEngine = field(default_factory=engine)
    committed: CommitPoint | None = None
    output: list[ClosedWindow] = field(default_factory=list)
    late: list[tuple[object, ...]] = field(default_factory=list)
    pending: list[ClosedWindow] = field(default_factory=list)
    pending_late: list[tuple[object, ...]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.engine.assign(P0, None, None, 0)

    def send(self, rows: list[Row]) -> None:
        self.log.append(rows)
        self._feed(len(self.log) - 1)

    def _feed(self, offset: int) -> None:
        rows = self.log[offset]
        times = [r[1] for r in rows]
        late = self.engine.add(pl.DataFrame(table(rows)),
                               [MessageRef(P0, offset, len(rows), min(times), max(times))], 0)
        if late is not None:
            self.pending_late += late.select("k", pl.col("ts").dt.epoch("ms"), "v",
                                             "lat").rows()

    def flush(self, now_ms: int = 0) -> None:
        self.pending += self.engine.close_due(now_ms)

    def commit(self) -> None:
        points = self.engine.commit_points()
        if points is None or P0 not in points:
            return
        self.committed = points[P0]
        self.output += self.pending
        self.late += self.pending_late
        self.pending, self.pending_late = [], []

    def crash(self) -> None:
        self.pending, self.pending_late = [], []
        self.engine = engine()
        point = self.committed
        self.engine.assign(P0, None if point is None else point.offset,
                           None if point is None else point.metadata, 0)
        for offset in range(0 if point is None else point.offset, len(self.log)):
            self._feed(offset)


@given(rows=rows_strategy, sizes=st.lists(st.integers(1, 5), min_size=1, max_size=20),
       steps=st.lists(st.sampled_from(["flush", "commit", "flush commit", "crash", ""]),
                      min_size=1, max_size=20))
def test_latest_revisions_equal_sql_over_the_rows_not_sent_late(
        rows: list[Row], sizes: list[int], steps: list[str]) -> None:
    """Rows arrive in any order, in messages of any size, with flushes, commits and
    crashes anywhere: the committed output's latest revision of every (window, keys)
    equals SQL over every row not committed to the late topic, and no revision number
    of a window is committed twice."""
    run = Run()
    sent = 0
    for index in range(len(rows)):
        if sent >= len(rows):
            break
        size = sizes[index % len(sizes)]
        run.send(rows[sent:sent + size])
        sent += size
        for step in steps[index % len(steps)].split():
            getattr(run, step)()
    run.flush()
    run.commit()
    run.flush(10**9)  # every partition idle: every open window out
    run.commit()
    revisions = [(w.start_ms, w.revision) for w in run.output]
    assert len(revisions) == len(set(revisions)), "a revision was committed twice"
    expected = reference(without(rows, run.late))
    assert_frame_equal(latest(run.output), expected, check_dtypes=False)


def without(rows: list[Row], taken: list[tuple[object, ...]]) -> list[Row]:
    left = list(rows)
    for row in taken:
        left.remove(row)  # type: ignore[arg-type]
    return left
