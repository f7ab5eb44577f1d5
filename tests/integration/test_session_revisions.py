"""Session windows that take every aggregate and revise, end to end through Apache Kafka:
median, a quantile, n_unique and an expression over each session's values, with
window.late: revise, while late rows keep coming and the daemon is SIGKILLed again and
again. A subscriber applying every committed revision holds DuckDB's sort-and-scan
sessions over every row not sent to the late topic, and no revision is committed
twice."""

from __future__ import annotations

import random
import re
import signal
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

from consumer.kafka.tail import read_output
from tests.conftest import TopicFactory
from tests.integration.conftest import (
    committed_offsets,
    end_offsets,
    publish_tables,
    wait_for,
)
from tests.integration.daemon_runs import IDLE_TIMEOUT_MS, start_running_daemon, write_config
from tests.integration.data import KEYS, T0, late_rows, sensor_table, without
from tests.integration.faults import write_figures
from tests.integration.session_data import GAP_MS, session_input, session_reference
from wire.output import OutputWindow

pytestmark = pytest.mark.integration

WITHIN_MS = 1_500
AHEAD_MS = 60_000  # the last rows, far ahead: every session closes, every revision ends
AGGREGATION = {
    "columns": {"reading_sum": "median", "reading_max": {"quantile": 0.9},
                "error_count": "n_unique"},
    "expressions": {"power_spread": "pl.col('power').max() - pl.col('power').min()"},
}
# The same in DuckDB: quantile_cont interpolates linearly, as Polars' 'linear' does.
AGGREGATES_SQL = """quantile_cont(reading_sum, 0.5) AS reading_sum,
    SUM(reading_count)::BIGINT AS reading_count, MIN(reading_min) AS reading_min,
    quantile_cont(reading_max, 0.9) AS reading_max, SUM(power) AS power,
    count(DISTINCT error_count) AS error_count, MAX("δ_max") AS "δ_max",
    max(power) - min(power) AS power_spread"""
_MAX_PAUSE_S = IDLE_TIMEOUT_MS / 1000 * 2 / 3  # below the idle timeout: see daemon_runs.py


def apply(messages: Sequence[OutputWindow]) -> tuple[pl.DataFrame, int]:
    """What a subscriber holds after applying every revision in order, as
    docs/wire-format.md says (each row first takes out the sessions of its keys it names
    in ``replaces``, which must be held under a lower revision, then is held as its
    session, which must be new), and how many sessions were replaced."""
    held: dict[tuple[Any, ...], dict[str, Any]] = {}
    replaced = 0
    for message in messages:
        assert message.kind in ("full", "update"), "no early revision here"
        for row in message.frame.to_dicts():
            keys = tuple(row[k] for k in KEYS)
            for start in row["replaces"]:
                gone = held.pop((*keys, start), None)
                assert gone is not None, f"{keys}@{start} replaced but not held"
                assert gone["revision"] < row["revision"], "revisions number on"
                replaced += 1
            assert (*keys, row["window_start"]) not in held, "a session emitted twice"
            held[(*keys, row["window_start"])] = row
    return sessions_frame(list(held.values())), replaced


def sessions_frame(rows: list[dict[str, Any]] | pl.DataFrame) -> pl.DataFrame:
    """Held sessions with epoch-ms bounds, in the reference's order and columns."""
    frame = rows if isinstance(rows, pl.DataFrame) else pl.DataFrame(rows)
    return frame.drop("revision", "replaces").with_columns(
        pl.col("window_start", "window_end").dt.epoch("ms")).sort(["window_start", *KEYS])


def whole_view(bootstrap: str, topic: str) -> pl.DataFrame:
    """The same through read_output(complete=True), which says what each revision replaced."""
    held: pl.DataFrame | None = None
    on = ["window_start", *KEYS]
    for window in read_output(bootstrap, topic, idle_timeout_s=1.5, complete=True):
        if window.start_ms >= T0 + AHEAD_MS:
            continue
        assert window.replaced is not None
        if held is not None and window.replaced.height:
            held = held.join(window.replaced.select(on), on=on, how="anti")
        held = window.frame if held is None else pl.concat([held, window.frame])
    assert held is not None
    return sessions_frame(held)


def emitted_from(bootstrap: str, topic: str, start_ms: int) -> bool:
    """Whether output of a session starting at or after ``start_ms`` is committed."""
    return any(w.start_ms >= start_ms for w in read_output(bootstrap, topic,
                                                           idle_timeout_s=1.0))


def test_sigkills_while_late_rows_revise_sessions_of_buffered_aggregates(
    bootstrap: str, topic_factory: TopicFactory, tmp_path: Path,
) -> None:
    source, sink = topic_factory("in", partitions=3), topic_factory("out")
    late_topic = topic_factory("late")
    config = write_config(
        tmp_path / "config.yaml", bootstrap, source, sink, f"g-{source}",
        late_topic=late_topic, aggregation=AGGREGATION,
        window={"kind": "session", "time": "event", "timestamp_column": "ts",
                "gap_ms": GAP_MS, "allowed_lateness_ms": 0, "idle_timeout_ms": IDLE_TIMEOUT_MS,
                "late": "revise", "revision_lateness_ms": WITHIN_MS})
    log = tmp_path / "daemon.log"
    rng = random.Random(29)
    data = session_input(batches_per_producer=45, producers=3, span_ms=30)  # 1.35 s
    kills = 5
    size = -(-len(data) // kills)
    sent: list[tuple[int, pa.Table]] = []
    started = time.monotonic()
    codes = []
    daemon = start_running_daemon(config, log)
    try:
        for number in range(kills):
            chunk = data[number * size:(number + 1) * size]
            newest = T0 + (number + 1) * size // 3 * 30
            # Late rows: 0.3 to 1.2 s behind the newest (revisions), and 2.4 s behind
            # (past the bound once the stream has gone that far: the late topic).
            behind = [(rng.randrange(3), sensor_table(rng, 12, newest - 1_200, 900)),
                      (rng.randrange(3), sensor_table(rng, 8, newest - 2_400, 100))]
            publish_tables(bootstrap, source, [*chunk, *behind], producer_id=f"w{number}")
            sent += [*chunk, *behind]
            time.sleep(rng.uniform(0.3, _MAX_PAUSE_S))
            daemon.send_signal(signal.SIGKILL)
            codes.append(daemon.wait(30))
            daemon = start_running_daemon(config, log)
        # Far ahead on every partition, twice: every earlier session closes and its
        # revisions end, so every offset but the last ones is committed. (A session's
        # commit offset is its first poll's: the first rows ahead may share a poll with
        # older rows, and once every partition is idle, kept sessions stay.)
        for ahead_ms in (AHEAD_MS, 2 * AHEAD_MS):
            ahead = [(p, sensor_table(rng, 5, T0 + ahead_ms, 100)) for p in range(3)]
            publish_tables(bootstrap, source, ahead, producer_id=f"ahead-{ahead_ms}")
            out_from = partial(emitted_from, bootstrap, sink, T0 + ahead_ms)
            wait_for(out_from, timeout_s=60, what="the sessions ahead to go out",
                     seen=lambda: f"daemon log:\n{log.read_text()[-3000:]}")
        group = f"g-{source}"
        wait_for(lambda: [c + 1 for c in committed_offsets(bootstrap, group, source)]
                 == end_offsets(bootstrap, source), timeout_s=60,
                 what="the daemon to commit all but the last messages",
                 seen=lambda: f"committed {committed_offsets(bootstrap, group, source)}, end "
                              f"{end_offsets(bootstrap, source)}; daemon log:\n"
                              f"{log.read_text()[-3000:]}")
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(30) == 0, log.read_text()[-3000:]
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(10)  # reaped, or Popen warns in a later test
    messages = [m for m in read_output(bootstrap, sink, idle_timeout_s=1.5)
                if m.start_ms < T0 + AHEAD_MS]
    late = late_rows(bootstrap, late_topic, 1, quiet_s=1.0)
    expected = session_reference([without([t for _, t in sent], late)], GAP_MS,
                                 AGGREGATES_SQL)
    held, replaced = apply(messages)
    rows = [r for m in messages for r in m.frame.select(*KEYS, "window_start", "revision")
            .rows()]
    text = log.read_text()
    replays = re.findall(r"session replay over: (\d+) replayed rows", text)
    write_figures("session_revisions_sigkill", {
        "sigkills": len(codes), "sessions": expected.height,
        "input_rows": sum(t.num_rows for _, t in sent),
        "late_rows": 0 if late is None else late.height,
        "revisions": sum(1 for m in messages if m.kind == "update"),
        "sessions_replaced": replaced,
        "most_revisions": max(r[-1] for r in rows), "replays": len(replays),
        "seconds": round(time.monotonic() - started, 1),
    })
    assert codes == [-signal.SIGKILL] * kills
    assert len(rows) == len(set(rows)), "a revision was committed twice"
    assert replaced >= 10, "too few revisions to judge"
    assert late is not None
    assert late.height > 0
    assert held.columns == expected.columns
    assert_frame_equal(held, expected, check_exact=False, rel_tol=1e-9, abs_tol=1e-9,
                       check_dtypes=False)
    assert_frame_equal(whole_view(bootstrap, sink), held)
    assert text.count("stopped cleanly") == 1
