"""Early results through Apache Kafka (window.emit_every_ms), on one instance and with the
scale-out: while a 10-second window is open, its changed groups come out every second as
provisional revisions (final: false, kind: update) with their whole current values; a
group's running value only grows (its row count and its sum of positive readings), up
to the window's closing revision, which equals DuckDB over every row. Session windows,
on both too: open sessions come out whole, growing up to the closing sessions."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

from consumer.kafka.tail import read_output
from tests.conftest import TopicFactory
from tests.integration.data import KEYS, T0, reference, sensor_table
from tests.integration.faults import (
    DurablePublisher,
    PacedPublishing,
    wait_until,
    write_figures,
)
from tests.integration.instances import (
    Instances,
    make_topics,
    session_frontiers,
    wait_all_windows,
)
from tests.integration.session_data import GAP_MS, session_input, session_reference, sessions_of
from wire.output import OutputWindow

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WINDOW_MS = 10_000
BATCH_SPAN_MS = 400  # event time a batch covers; one batch every 0.1 s of wall time
BATCHES = 60  # 24 s of event time: windows 0 and 1 whole, and window 2 begun


def paced_input(rng: random.Random) -> list[tuple[int, pa.Table]]:
    """Event time moving on 4x the wall clock's pace, every partition in step: a window
    stays open ~2.5 s of processing time, long enough for a few provisional revisions."""
    return [(partition, sensor_table(rng, 40, T0 + step * BATCH_SPAN_MS, BATCH_SPAN_MS))
            for step in range(BATCHES) for partition in range(4)]


@pytest.mark.parametrize("scale_out", [False, True], ids=["one-instance", "scale-out"])
def test_provisional_revisions_grow_to_the_closing_one(
    bootstrap: str, topic_factory: TopicFactory, tmp_path: Path, scale_out: bool,
) -> None:
    topics = make_topics(topic_factory)
    data = paced_input(random.Random(36))
    sections = {"window": {"kind": "tumbling", "size_ms": WINDOW_MS, "emit_every_ms": 500,
                           "allowed_lateness_ms": BATCH_SPAN_MS, "idle_timeout_ms": 2000}}
    instances = Instances(tmp_path, bootstrap, topics, sections=sections,
                          repartitions=3 if scale_out else None)
    publisher = DurablePublisher(bootstrap, topics["input"])
    try:
        instances.start("a")
        started = time.monotonic()
        PacedPublishing(publisher, data, pause_s=0.025).finish()
        publisher.flush()
        if scale_out:
            wait_all_windows(bootstrap, topics, data, parts=3, size_ms=WINDOW_MS)
        else:
            time.sleep(4)  # the idle timeout closes the last window
        instances.stop_all()
    finally:
        instances.kill_all()
    published_s = time.monotonic() - started
    windows = list(read_output(bootstrap, topics["output"], idle_timeout_s=3.0))
    provisional = [w for w in windows if not w.final]
    final = pl.concat([w.frame for w in windows if w.final and w.kind != "update"])
    expected = reference([t for _, t in data], WINDOW_MS)
    window_keys = ["window_start", *KEYS]
    got = final.with_columns(pl.col("window_start").dt.epoch("ms"),
                             pl.col(KEYS).cast(pl.String)).drop("window_end")
    assert_frame_equal(got.select(expected.columns).sort(window_keys), expected,
                       check_exact=False, rel_tol=1e-9, check_dtypes=False)
    running = growth(provisional, got)
    write_figures(f"early_results_{'scale_out' if scale_out else 'one_instance'}", {
        "windows": expected["window_start"].n_unique(), "published_s": round(published_s, 1),
        "provisional_messages": len(provisional), **running})
    assert len(provisional) >= 3
    assert all(w.kind == "update" for w in provisional)
    assert running["windows_with_provisional"] >= 2


def growth(provisional: list[OutputWindow], final: pl.DataFrame) -> dict[str, int]:
    """Every group's provisional row counts, in output order, only grow and end at or
    below its final count; the figures of how many there were."""
    seen: dict[tuple[int, ...], list[int]] = {}
    for window in provisional:
        frame = window.frame.with_columns(pl.col(KEYS).cast(pl.String))
        for row in frame.select(*KEYS, "row_count").iter_rows():
            seen.setdefault((window.start_ms, *row[:-1]), []).append(int(row[-1]))
    finals = {(int(r[0]), *r[1:-1]): int(r[-1]) for r in final.select(
        "window_start", *KEYS, "row_count").iter_rows()}
    for group, counts in seen.items():
        assert counts == sorted(counts), f"{group}: a provisional count went down: {counts}"
        assert counts[-1] <= finals[group], f"{group}: {counts} past the final {finals[group]}"
    return {"groups_with_provisional": len(seen),
            "windows_with_provisional": len({g[0] for g in seen}),
            "most_provisional_of_a_group": max((len(c) for c in seen.values()), default=0)}


@pytest.mark.parametrize("scale_out", [False, True], ids=["one-instance", "scale-out"])
def test_provisional_sessions_grow_to_the_closing_ones(
    bootstrap: str, topic_factory: TopicFactory, tmp_path: Path, scale_out: bool,
) -> None:
    """Session windows, on one instance and with the scale-out: while sessions run, they
    come out provisionally, whole; a provisional session's row count only grows under
    its (keys, start) and never passes the closing session that covers its start, and
    the closing sessions equal DuckDB's sort-and-scan. With the scale-out the provisional
    ones are in no frontier batch, and whole-session readers get exactly the closing
    ones."""
    topics = make_topics(topic_factory)
    data = session_input(batches_per_producer=40, producers=4, span_ms=40)
    sections = {"window": {"kind": "session", "time": "event", "timestamp_column": "ts",
                           "gap_ms": GAP_MS, "size_ms": None, "emit_every_ms": 200,
                           "allowed_lateness_ms": 0, "idle_timeout_ms": 2000}}
    instances = Instances(tmp_path, bootstrap, topics, sections=sections,
                          repartitions=3 if scale_out else None)
    publisher = DurablePublisher(bootstrap, topics["input"])
    last_end = max(int(pl.DataFrame(t).select(pl.col("ts").dt.epoch("ms").max()).item())
                   for _, t in data) + GAP_MS
    started = time.monotonic()
    try:
        instances.start("a")
        PacedPublishing(publisher, data, pause_s=0.025).finish()
        publisher.flush()
        if scale_out:  # every partition idle: every part's frontier past the last session
            wait_until(lambda: (t := session_frontiers(bootstrap, topics["output"]))
                       and len(t) == 3 and min(t.values()) >= last_end,
                       timeout_s=60, what="every part's frontier past the last session")
        else:
            time.sleep(5)  # the idle timeout closes the last sessions
        instances.stop_all()
    finally:
        instances.kill_all()
    published_s = time.monotonic() - started
    windows = list(read_output(bootstrap, topics["output"], idle_timeout_s=3.0))
    provisional = [w for w in windows if not w.final]
    final = sessions_of(pl.concat([w.frame for w in windows if w.final]))
    expected = session_reference([t for _, t in data], GAP_MS)
    assert_frame_equal(final.with_columns(pl.col("window_start").dt.epoch("ms")).select(
        expected.columns).sort(["window_start", *KEYS]), expected, check_exact=False,
        rel_tol=1e-9, abs_tol=1e-9, check_dtypes=False)
    assert all(w.kind == "update" and w.sessions for w in provisional)
    if scale_out:
        assert all(w.frontier_batch is None and w.part is not None for w in provisional)
        wholes = list(read_output(bootstrap, topics["output"], idle_timeout_s=3.0,
                                  complete=True))
        assert_frame_equal(sessions_of(pl.concat([w.frame for w in wholes])), final)
    counts: dict[tuple[Any, ...], list[int]] = {}
    for window in provisional:
        frame = window.frame.with_columns(pl.col("window_start").dt.epoch("ms"))
        for values in frame.select(*KEYS, "window_start", "row_count").iter_rows():
            counts.setdefault(values[:-1], []).append(int(values[-1]))
    closing = final.with_columns(pl.col("window_start").dt.epoch("ms"))
    for (*keys, start), seen in counts.items():
        assert seen == sorted(seen), f"{keys}@{start}: a provisional count went down: {seen}"
        covering = closing.filter(*(pl.col(k) == v for k, v in zip(KEYS, keys, strict=True)),
                                  pl.col("window_start") <= start, pl.col("window_end") > start)
        assert covering.height == 1
        assert seen[-1] <= covering.item(0, "row_count")
    write_figures(f"early_results_sessions{'_scale_out' if scale_out else ''}", {
        "sessions": expected.height, "provisional_messages": len(provisional),
        "provisional_sessions": len(counts), "published_s": round(published_s, 1),
        "most_provisional_of_a_session": max((len(c) for c in counts.values()), default=0)})
    assert len(provisional) >= 3
    assert len(counts) >= 10
