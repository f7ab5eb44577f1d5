"""window.late: revise through Apache Kafka: late rows within revision_lateness_ms come out
as update revisions of their windows, later ones on the late topic; the latest revision of
every (window, keys) equals DuckDB over the rows not sent late. Then the daemon as a
process, SIGKILLed again and again while late rows keep coming: still exact, no revision
committed twice, revision numbers consecutive across restarts."""

from __future__ import annotations

import random
import signal
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from confluent_kafka import Consumer
from polars.testing import assert_frame_equal

from consumer.kafka.tail import read_output
from tests.conftest import TopicFactory
from tests.integration.conftest import (
    committed_offsets,
    daemon_settings,
    end_offsets,
    publish_tables,
    running_daemon,
    wait_for,
)
from tests.integration.daemon_runs import start_running_daemon, write_config
from tests.integration.data import (
    KEYS,
    T0,
    late_rows,
    make_input,
    reference,
    sensor_table,
    without,
)
from tests.integration.faults import write_figures
from wire.output import OutputWindow, decode_output

pytestmark = pytest.mark.integration

SIZE_MS = 500
WITHIN_MS = 1_200


def revise(size_ms: int, within_ms: int, idle_timeout_ms: int) -> dict[str, object]:
    return {"kind": "tumbling", "time": "event", "timestamp_column": "ts", "size_ms": size_ms,
            "allowed_lateness_ms": 0, "idle_timeout_ms": idle_timeout_ms, "late": "revise",
            "revision_lateness_ms": within_ms}


def latest(messages: Sequence[OutputWindow]) -> pl.DataFrame:
    """What a subscriber keeps: each (window, keys) row of its latest revision."""
    rows = pl.concat([m.frame for m in messages]).sort("revision")
    rows = rows.unique(["window_start", *KEYS], keep="last", maintain_order=True)
    return rows.with_columns(pl.col("window_start").dt.epoch("ms")).drop(
        "window_end", "revision").sort(["window_start", *KEYS])


def check_revisions(messages: Sequence[OutputWindow]) -> dict[int, int]:
    """Every message once; each window's revisions 0, 1, 2, ... with no gap: numbering
    that restarted or a revision written twice would show. Returns the last per window."""
    seen = [(m.start_ms, m.revision, m.chunk) for m in messages]
    assert len(seen) == len(set(seen)), "a revision was committed twice"
    revisions: dict[int, set[int]] = {}
    for message in messages:
        revisions.setdefault(message.start_ms, set()).add(message.revision)
        assert message.kind == ("full" if message.revision == 0 else "update"), (
            f"window {message.start_ms}: revision {message.revision} is {message.kind}")
        assert set(message.frame["revision"].to_list()) == {message.revision}
    for start, numbers in revisions.items():
        assert numbers == set(range(len(numbers))), f"window {start}: revisions {numbers}"
    return {start: max(numbers) for start, numbers in revisions.items()}


def whole_windows(bootstrap: str, topic: str) -> pl.DataFrame:
    """The last whole view read_output(complete=True) hands out of each window."""
    last: dict[int, OutputWindow] = {}
    for window in read_output(bootstrap, topic, idle_timeout_s=3.0, complete=True):
        last[window.start_ms] = window
    return latest(list(last.values()))


class UpdateWatch:
    """A read_committed subscriber that notes when each update revision arrives."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"w-{topic}",
                                   "auto.offset.reset": "earliest",
                                   "isolation.level": "read_committed"})
        self._consumer.subscribe([topic])

    def next_update(self, timeout_s: float) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            message = self._consumer.poll(0.05)
            if message is None or message.error() is not None:
                continue
            if decode_output(message.value(), message.headers()).kind == "update":
                return time.monotonic()
        pytest.fail(f"no update revision within {timeout_s}s")

    def close(self) -> None:
        self._consumer.close()


def test_late_rows_within_the_bound_revise_their_windows_exactly(
    bootstrap: str, topic_factory: TopicFactory
) -> None:
    source, sink = topic_factory("in", partitions=3), topic_factory("out")
    late_topic = topic_factory("late")
    data = make_input(batches_per_producer=60, producers=3, span_ms=40)  # T0 .. T0 + 2.4 s
    rng = random.Random(3)
    # Windows [T0 + 1500, T0 + 2500) are kept (the watermark ends near T0 + 2400, less
    # 1.2 s); [T0, T0 + 1000) are not: their rows go to the late topic.
    within = [(p, sensor_table(rng, 30, T0 + 1_600, 800)) for p in range(3)]
    beyond = [(p, sensor_table(rng, 20, T0, 900)) for p in range(3)]
    settings = daemon_settings(bootstrap, source, sink, output={"late_topic": late_topic},
                               window=revise(SIZE_MS, WITHIN_MS, idle_timeout_ms=1_500))
    watch = UpdateWatch(bootstrap, sink)
    latencies = []
    with running_daemon(settings) as daemon:
        publish_tables(bootstrap, source, data)
        rows = sum(t.num_rows for _, t in data)
        wait_for(lambda: daemon.processor.progress.counters.rows == rows, timeout_s=60,
                 what="the in-order rows taken")
        wait_for(lambda: daemon.processor.progress.settled, timeout_s=30,
                 what="every window emitted")
        for message in [*within, *beyond]:
            sent = time.monotonic()
            publish_tables(bootstrap, source, [message])
            if message in within:
                latencies.append(watch.next_update(timeout_s=30) - sent)
        rows += sum(t.num_rows for _, t in [*within, *beyond])
        wait_for(lambda: daemon.processor.progress.counters.rows == rows, timeout_s=60,
                 what="the late rows taken")
        wait_for(lambda: daemon.processor.progress.settled, timeout_s=30,
                 what="every revision committed")
    watch.close()
    messages = list(read_output(bootstrap, sink, idle_timeout_s=3.0))
    late = late_rows(bootstrap, late_topic, 1)
    tables = [t for _, t in [*data, *within, *beyond]]
    expected = reference([without(tables, late)], SIZE_MS)
    last = check_revisions(messages)
    write_figures("revisions", {
        "windows": len(last), "revised_windows": sum(1 for n in last.values() if n),
        "update_messages": sum(1 for m in messages if m.kind == "update"),
        "late_rows": 0 if late is None else late.height,
        "revision_latency_s": [round(s, 3) for s in latencies],
        "revision_latency_median_s": round(statistics.median(latencies), 3),
    })
    assert late is not None
    assert late.height == sum(t.num_rows for _, t in beyond)
    assert sorted(n for n in last.values() if n) == [3, 3]  # [1500, 2000), [2000, 2500)
    assert_frame_equal(latest(messages), expected, check_exact=False, rel_tol=1e-9,
                       abs_tol=1e-9, check_dtypes=False)
    assert_frame_equal(whole_windows(bootstrap, sink), expected, check_exact=False,
                       rel_tol=1e-9, abs_tol=1e-9, check_dtypes=False)


KILL_SIZE_MS = 400
KILL_WITHIN_MS = 2_000
KILL_IDLE_MS = 1_500
_MAX_PAUSE_S = KILL_IDLE_MS / 1000 * 2 / 3  # below the idle timeout: see test_recovery.py


def test_sigkills_while_late_rows_revise_windows_lose_and_repeat_nothing(
    bootstrap: str, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    source, sink = topic_factory("in", partitions=3), topic_factory("out")
    late_topic = topic_factory("late")
    config = write_config(tmp_path / "config.yaml", bootstrap, source, sink, f"g-{source}",
                          late_topic=late_topic,
                          window=revise(KILL_SIZE_MS, KILL_WITHIN_MS, KILL_IDLE_MS))
    log = tmp_path / "daemon.log"
    rng = random.Random(17)
    data = make_input(batches_per_producer=100, producers=3, span_ms=30)  # 3 s of events
    kills = 10
    size = -(-len(data) // kills)
    sent: list[tuple[int, pa.Table]] = []
    daemon = start_running_daemon(config, log)
    try:
        for number in range(kills):
            chunk = data[number * size:(number + 1) * size]
            newest = T0 + (number + 1) * size // 3 * 30
            # Late rows: 0.5 to 1.7 s behind the newest (revisions), and 2.5 s behind
            # (past the bound, once the stream has gone that far: the late topic).
            behind = [(rng.randrange(3), sensor_table(rng, 15, newest - 1_700, 1_200)),
                      (rng.randrange(3), sensor_table(rng, 10, newest - 2_600, 100))]
            publish_tables(bootstrap, source, [*chunk, *behind], producer_id=f"w{number}")
            sent += [*chunk, *behind]
            time.sleep(rng.uniform(0.3, _MAX_PAUSE_S))
            daemon.send_signal(signal.SIGKILL)
            assert daemon.wait(30) == -signal.SIGKILL
            daemon = start_running_daemon(config, log)
        # Far ahead on every partition: every earlier window closes and its revisions
        # end, so every offset but these last ones is committed.
        ahead = [(p, sensor_table(rng, 5, T0 + 60_000, 100)) for p in range(3)]
        publish_tables(bootstrap, source, ahead, producer_id="last")
        wait_for(lambda: [c + 1 for c in committed_offsets(bootstrap, f"g-{source}", source)]
                 == end_offsets(bootstrap, source), timeout_s=90,
                 what="the daemon to commit all but the last messages",
                 seen=lambda: f"daemon log:\n{log.read_text()[-3000:]}")
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(30) == 0, log.read_text()[-3000:]
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(10)  # reaped, or Popen warns in a later test
    messages = [m for m in read_output(bootstrap, sink, idle_timeout_s=3.0)
                if m.start_ms < T0 + 60_000]  # not the last rows' window
    late = late_rows(bootstrap, late_topic, 1)
    expected = reference([without([t for _, t in sent], late)], KILL_SIZE_MS)
    last_revisions = check_revisions(messages)
    write_figures("revisions_sigkill", {
        "sigkills": kills, "windows": len(last_revisions),
        "revised_windows": sum(1 for n in last_revisions.values() if n),
        "most_revisions": max(last_revisions.values()),
        "late_rows": 0 if late is None else late.height,
    })
    assert sum(1 for n in last_revisions.values() if n) >= 5, "too few revisions to judge"
    assert late is not None
    assert late.height > 0
    assert_frame_equal(latest(messages), expected, check_exact=False, rel_tol=1e-9,
                       abs_tol=1e-9, check_dtypes=False)
    assert log.read_text().count("stopped cleanly") == 1
