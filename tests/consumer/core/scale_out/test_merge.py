"""Stage 2 of the scale-out, one repartition partition: windows come out when every
input partition is past them, once, with or without rows here."""

from __future__ import annotations

import polars as pl
import pyarrow as pa
from polars.testing import assert_frame_equal

from consumer.core.aggregate import PartialAggregator
from consumer.core.offsets import CommitMetadata
from consumer.core.plan import AggregationPlan, ColumnAgg
from consumer.core.scale_out.merge import Completed, MergeEngine
from consumer.core.scale_out.stage_one import plan_text
from consumer.core.types import WINDOW_START, PartitionKey
from wire.repartition import Partial, ProgressRecord, ReportedFrontier

REP: PartitionKey = ("rep", 0)
IN0, IN1 = ("in", 0), ("in", 1)
PLAN = AggregationPlan(keys=("k",), aggregates=(ColumnAgg("v", "sum"), ColumnAgg("m", "max")),
                       skipped=(), time_column=None)


def partial(start: int, rows: dict[str, list[float]]) -> Partial:
    """What stage 1 sends: the state of ``rows`` (k -> values) for window [start, +1000)."""
    frame = pl.DataFrame({"k": [k for k, vs in rows.items() for _ in vs],
                          "v": [v for vs in rows.values() for v in vs],
                          "m": [v for vs in rows.values() for v in vs]})
    aggregator = PartialAggregator(PLAN, (WINDOW_START, "k"))
    state = aggregator.partial(frame.lazy().with_columns(pl.lit(start).alias(WINDOW_START)))
    exported = aggregator.export_state(state)
    return Partial(start, start + 1000, plan_text(PLAN), exported.to_arrow())


def progress(*reports: tuple[PartitionKey, int | None, bool],
             windows: tuple[tuple[int, int], ...] = ()) -> ProgressRecord:
    return ProgressRecord("w", tuple(ReportedFrontier(t, p, f, i) for (t, p), f, i in reports),
                    windows)


def engine(metadata: CommitMetadata | None = None, committed: int | None = None) -> MergeEngine:
    return MergeEngine(REP, {IN0, IN1}, committed=committed, metadata=metadata, merge_every=4)


def results(done: list[Completed]) -> pl.DataFrame:
    frames = [d.window.frame for d in done if d.window is not None]
    return pl.concat(frames).select("k", "v", "m", "row_count").sort("k")


def test_a_window_waits_for_every_input_partition() -> None:
    merge = engine()
    merge.add_partial(0, partial(0, {"a": [1.0, 2.0]}))
    merge.add_progress(1, progress((IN0, 1000, False), windows=((0, 1000),)))
    assert merge.close_due() == [], "in-1 has not reported"
    merge.add_partial(2, partial(0, {"a": [3.0], "b": [5.0]}))
    merge.add_progress(3, progress((IN1, 500, False)))
    assert merge.close_due() == [], "in-1 is not past the window"
    merge.add_progress(4, progress((IN1, 2000, False)))
    (done,) = merge.close_due()
    assert (done.start_ms, done.end_ms) == (0, 1000)
    assert_frame_equal(results([done]), pl.DataFrame(
        {"k": ["a", "b"], "v": [6.0, 5.0], "m": [3.0, 5.0], "row_count": [3, 1]}),
        check_dtypes=False)
    assert merge.close_due() == []
    assert merge.commit_point() is not None
    assert merge.commit_point().offset == 5  # type: ignore[union-attr]


def test_idle_partitions_do_not_hold_windows_back_until_all_are_idle() -> None:
    merge = engine()
    merge.add_partial(0, partial(0, {"a": [1.0]}))
    merge.add_progress(1, progress((IN0, 1000, False), (IN1, None, True), windows=((0, 1000),)))
    assert [d.start_ms for d in merge.close_due()] == [0]
    merge.add_partial(2, partial(1000, {"a": [1.0]}))
    merge.add_progress(3, progress((IN0, 3000, True), (IN1, 1500, True),
                                   windows=((1000, 2000),)))
    assert [d.start_ms for d in merge.close_due()] == [1000], "all idle: the furthest counts"


def test_announced_windows_without_rows_here_still_end() -> None:
    merge = engine()
    merge.add_progress(0, progress((IN0, 1000, False), (IN1, 1000, False),
                                   windows=((0, 1000),)))
    (done,) = merge.close_due()
    assert done.window is None
    assert (done.start_ms, done.end_ms) == (0, 1000)


def test_frontiers_never_go_back() -> None:
    merge = engine()
    merge.add_partial(0, partial(0, {"a": [1.0]}))
    merge.add_progress(1, progress((IN0, 1000, False), (IN1, 1000, False),
                                   windows=((0, 1000),)))
    merge.add_progress(2, progress((IN1, 400, False)))  # an older owner's report, replayed
    assert [d.start_ms for d in merge.close_due()] == [0]


def test_a_restart_skips_what_it_emitted_and_merges_the_rest() -> None:
    # Emitted through 1000 before the restart, having read up to offset 3.
    merge = engine(CommitMetadata(frontier=1000, position=3, max_event_ms=None), committed=0)
    merge.add_partial(0, partial(0, {"a": [1.0]}))  # replayed, emitted: skipped
    merge.add_partial(1, partial(1000, {"a": [2.0]}))
    merge.add_partial(2, partial(1000, {"a": [4.0]}))
    merge.add_progress(3, progress((IN0, 2000, False), (IN1, 2000, False),
                                   windows=((0, 1000), (1000, 2000))))
    done = merge.close_due()
    assert [d.start_ms for d in done] == [1000]
    assert_frame_equal(results(done), pl.DataFrame(
        {"k": ["a"], "v": [6.0], "m": [4.0], "row_count": [2]}), check_dtypes=False)
    assert merge.late_windows() == []


def test_a_partial_of_an_emitted_window_is_late_not_merged() -> None:
    merge = engine()
    merge.add_progress(0, progress((IN0, 1000, False), (IN1, 1000, False),
                                   windows=((0, 1000),)))
    assert len(merge.close_due()) == 1
    merge.add_partial(1, partial(0, {"z": [7.0]}))  # e.g. from a partition added later
    (late,) = merge.late_windows()
    assert late.frame["k"].to_list() == ["z"]
    assert late.input_rows == 1
    assert merge.close_due() == []


def test_partials_with_plain_and_categorical_keys_merge() -> None:
    merge = engine()
    categorical = partial(0, {"a": [1.0]})
    plain = pl.DataFrame(partial(0, {"a": [2.0]}).state)
    assert plain.schema["k"] == pl.String
    merge.add_partial(0, Partial(0, 1000, categorical.plan,
                                 pl.DataFrame(categorical.state).with_columns(
                                     pl.col("k").cast(pl.Categorical)).to_arrow()))
    merge.add_partial(1, Partial(0, 1000, categorical.plan, pa.table(plain.to_arrow())))
    merge.add_progress(2, progress((IN0, 1000, False), (IN1, 1000, False)))
    assert results(merge.close_due())["v"].to_list() == [3.0]
