"""Zombies, through Apache Kafka: a second process with the same transactional.id fences
the first, which exits non-zero; an instance stalled past max.poll.interval.ms wakes up
and cannot commit a duplicate window. Either way the output equals the reference.

The input pauses between chunks for longer than the idle timeout, so open windows close
on idleness there: chunks end on window boundaries, or their next rows would be late.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient
from polars.testing import assert_frame_equal

from tests.conftest import TopicFactory
from tests.integration.conftest import committed_offsets, end_offsets, publish_tables
from tests.integration.daemon_runs import (
    IDLE_TIMEOUT_MS,
    SIZE_MS,
    start_daemon,
    write_config,
)
from tests.integration.data import KEYS, make_input, output_frame, reference
from tests.integration.faults import (
    keyed_by_partition,
    late_rows_logged,
    repeated_groups,
    wait_until,
    write_figures,
)
from tests.integration.instances import FENCED_EXIT_S, owners

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SPAN_MS = 40
BATCHES_PER_WINDOW = SIZE_MS // SPAN_MS
assert BATCHES_PER_WINDOW * SPAN_MS == SIZE_MS


def window_aligned_chunks(chunks: int, windows_per_chunk: int = 2,
                          ) -> list[list[tuple[int, pa.Table]]]:
    """Input of two partitions, keyed by partition, cut into chunks of whole windows."""
    batches = windows_per_chunk * BATCHES_PER_WINDOW
    data = keyed_by_partition(make_input(batches_per_producer=chunks * batches, producers=2,
                                         span_ms=SPAN_MS))
    size = batches * 2
    return [data[i:i + size] for i in range(0, len(data), size)]


def wait_input_committed(bootstrap: str, group: str, topic: str, what: str) -> None:
    """Until the group's committed offsets reach the input's end: every window of the
    input published so far is in a committed transaction."""
    wait_until(lambda: committed_offsets(bootstrap, group, topic)
               == end_offsets(bootstrap, topic), timeout_s=90, what=what)


def refusals(log: Path) -> dict[str, int]:
    """How a woken zombie was refused: transactions the broker aborted, assignments
    declared lost."""
    text = log.read_text()
    return {"transactions_aborted": text.count("transaction aborted"),
            "assignments_lost": text.count("discarding window state")}


def merged_rows(bootstrap: str, sink: str) -> pl.DataFrame:
    got, _ = output_frame(bootstrap, sink)
    return got.drop("window_end").sort(["window_start", *KEYS])


def check_output(bootstrap: str, sink: str, chunks: list[list[tuple[int, pa.Table]]],
                 *logs: Path) -> dict[str, int]:
    got = merged_rows(bootstrap, sink)
    expected = reference([t for chunk in chunks for _, t in chunk], SIZE_MS)
    window_keys = ["window_start", *KEYS]
    figures = {
        "output_rows": got.height, "reference_rows": expected.height,
        "duplicates": repeated_groups(got, KEYS),
        "lost": expected.join(got.select(window_keys), on=window_keys, how="anti").height,
        "late_rows": late_rows_logged(*logs),
    }
    assert figures["duplicates"] == 0, "a (window, keys) row was committed twice"
    assert figures["late_rows"] == 0, "in-order input turned late"
    assert_frame_equal(got, expected, check_exact=False, rel_tol=1e-9, abs_tol=1e-9,
                       check_dtypes=False)
    return figures


def test_zombie_with_the_same_transactional_id_is_fenced_and_exits_non_zero(
    bootstrap: str, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    source, sink = topic_factory("in", partitions=2), topic_factory("out")
    config = write_config(tmp_path / "config.yaml", bootstrap, source, sink, f"g-{source}",
                          instance_id="same-instance")
    chunks = window_aligned_chunks(2)
    logs = tmp_path / "zombie.log", tmp_path / "successor.log"
    zombie = start_daemon(config, logs[0])
    successor = None
    group = f"g-{source}"
    try:
        publish_tables(bootstrap, source, chunks[0], producer_id="w1")
        wait_input_committed(bootstrap, group, source, "the first instance to commit chunk 1")
        successor = start_daemon(config, logs[1])
        code = zombie.wait(FENCED_EXIT_S)
        zombie_log = logs[0].read_text()
        last_line = zombie_log.strip().splitlines()[-1]
        publish_tables(bootstrap, source, chunks[1], producer_id="w2")
        wait_input_committed(bootstrap, group, source, "the successor to commit chunk 2")
        successor.send_signal(signal.SIGTERM)
        successor_code = successor.wait(30)
    finally:
        for process in (zombie, successor):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(10)  # reaped, or Popen warns in a later test
    figures = check_output(bootstrap, sink, chunks, *logs)
    write_figures("zombie", {"zombie_exit": code, "zombie_last_line": last_line,
                             "successor_exit": successor_code, **figures})
    assert code == 1
    assert last_line.startswith("consumer: stopping on a fatal Kafka error:"), last_line
    assert "fenced" in last_line
    assert "Traceback" not in zombie_log
    assert successor_code == 0


def test_a_stalled_instance_cannot_commit_a_duplicate_window(
    bootstrap: str, admin: AdminClient, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    source, sink = topic_factory("in", partitions=2), topic_factory("out")
    group = f"g-{source}"
    timeouts = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000,
                "max.poll.interval.ms": 8000}
    configs = [write_config(tmp_path / f"{name}.yaml", bootstrap, source, sink, group,
                            instance_id=name, consumer=timeouts) for name in ("a", "b")]
    logs = tmp_path / "a.log", tmp_path / "b.log"
    chunks = window_aligned_chunks(3)
    stalled = start_daemon(configs[0], logs[0])
    other: subprocess.Popen[bytes] | None = None
    try:
        publish_tables(bootstrap, source, chunks[0], producer_id="w1")
        wait_input_committed(bootstrap, group, source, "instance a to commit chunk 1")
        other = start_daemon(configs[1], logs[1])
        wait_until(lambda: len(layout := owners(admin, group, source, 2)) == 2
                   and all(layout.values()), timeout_s=60,
                   what="b to join and own a partition: the partitions shared")
        publish_tables(bootstrap, source, chunks[1], producer_id="w2")
        time.sleep(0.5)
        stalled.send_signal(signal.SIGSTOP)  # stalled mid-stream, maybe mid-transaction
        stalled_at = time.monotonic()
        # Past session.timeout.ms and max.poll.interval.ms: b takes every partition over.
        wait_until(lambda: owners(admin, group, source, 2) == {"b": [0, 1]}, timeout_s=60,
                   what="b to own every partition while a is stopped")
        publish_tables(bootstrap, source, chunks[2], producer_id="w3")
        stalled_s = round(time.monotonic() - stalled_at, 1)
        stalled.send_signal(signal.SIGCONT)  # the zombie wakes up and tries to go on
        wait_until(lambda: sum(refusals(logs[0]).values()) > 0, timeout_s=60,
                   what="the woken instance to be refused")
        wait_input_committed(bootstrap, group, source, "every chunk committed")
        stalled.send_signal(signal.SIGTERM)
        other.send_signal(signal.SIGTERM)
        codes = [stalled.wait(30), other.wait(30)]
    finally:
        for process in (stalled, other):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(10)  # reaped, or Popen warns in a later test
    figures = check_output(bootstrap, sink, chunks, *logs)
    refused = refusals(logs[0])
    write_figures("stalled", {"exit_codes": codes, "stalled_s": stalled_s,
                              "max_poll_interval_ms": 8000, **refused, **figures})
    assert codes == [0, 0]
    # The woken instance tried to go on and was refused: its transaction aborted by the
    # broker (unknown member) or its assignment declared lost; nothing of it committed.
    assert sum(refused.values()) >= 1, logs[0].read_text()[-3000:]


def test_an_instance_stopped_past_its_idle_timeout_turns_nothing_that_came_meanwhile_late(
    bootstrap: str, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """A lone instance (no rebalance: its session outlasts the stop) is stopped mid-window
    for longer than its idle timeout while input arrives. Woken, its client's cache of the
    partition's end predates the stop; the loop must ask the broker, not close the open
    window as idle and send the rest of it late (soak run 3's rebalance storm)."""
    source, sink = topic_factory("in"), topic_factory("out")
    group = f"g-{source}"
    config = write_config(tmp_path / "config.yaml", bootstrap, source, sink, group)
    data = make_input(batches_per_producer=5 * BATCHES_PER_WINDOW, producers=1,
                      span_ms=SPAN_MS)
    half = BATCHES_PER_WINDOW * 5 // 2  # the stop falls in the middle of window 2
    chunks = [data[:half], data[half:]]
    log = tmp_path / "daemon.log"
    daemon = start_daemon(config, log)
    try:
        publish_tables(bootstrap, source, chunks[0], producer_id="w1")
        wait_until(lambda: any(end_offsets(bootstrap, sink)), timeout_s=60,
                   what="the first windows out: the instance is consuming")
        daemon.send_signal(signal.SIGSTOP)
        publish_tables(bootstrap, source, chunks[1], producer_id="w2")
        time.sleep(IDLE_TIMEOUT_MS / 1000 + 2.0)  # the stop itself is what is tested
        daemon.send_signal(signal.SIGCONT)
        wait_input_committed(bootstrap, group, source, "every window committed")
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(30)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(10)  # reaped, or Popen warns in a later test
    figures = check_output(bootstrap, sink, chunks, log)
    write_figures("stopped_past_idle", {"exit_code": code, **figures})
    assert code == 0
