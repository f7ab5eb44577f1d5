"""The daemon as a real process: SIGKILL it mid-stream again and again, restart it, and the
committed output still equals the reference — nothing lost, no window twice. SIGTERM
exits 0 and loses nothing either; at-least-once mode loses nothing and repeats little."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
import yaml
from confluent_kafka import Consumer, Producer
from polars.testing import assert_frame_equal

from tests.conftest import REPO, TopicFactory
from tests.integration.conftest import (
    committed_offsets,
    end_offsets,
    publish_tables,
    wait_for,
)
from tests.integration.faults import read_topic, write_figures
from tests.integration.test_pipeline import KEYS, make_input, output_frame, reference
from wire.output import decode_output

pytestmark = pytest.mark.integration

SIZE_MS = 400
IDLE_TIMEOUT_MS = 1500
# A stop comes at most this long after a chunk is published. It must stay well below the
# idle timeout: a daemon that sees no input for IDLE_TIMEOUT_MS closes its open windows
# (as designed), so a longer pause would emit a window holding only this chunk's part of
# it, and the next chunk's rows of that window would arrive late.
_MAX_PAUSE_S = IDLE_TIMEOUT_MS / 1000 * 2 / 3


def write_config(path: Path, bootstrap: str, source: str, sink: str, group: str, *,
                 instance_id: str = "instance-0", guarantee: str = "exactly_once",
                 consumer: dict[str, Any] | None = None, dlq_topic: str | None = None,
                 late_topic: str | None = None, window: dict[str, Any] | None = None,
                 ) -> Path:
    """``window``: the window section instead of SIZE_MS tumbling event-time windows."""
    routes = {"dlq_topic": dlq_topic, "late_topic": late_topic}
    config = {
        "kafka": {"bootstrap_servers": bootstrap, "group_id": group,
                  "consumer": consumer or {}},
        "input": {"topics": [source]},
        "output": {"topic": sink, **{k: v for k, v in routes.items() if v}},
        "window": window or {"kind": "tumbling", "time": "event", "timestamp_column": "ts",
                             "size_ms": SIZE_MS, "idle_timeout_ms": IDLE_TIMEOUT_MS},
        "processing": {"instance_id": instance_id, "guarantee": guarantee,
                       "poll_max_messages": 20, "poll_timeout_ms": 100,
                       "commit_interval_ms": 200},
        "service": {"http_port": 0, "statistics_interval_ms": 0},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def start_daemon(config: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "consumer", "run", "--config", str(config)],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


_RUNNING_LINE = "arrowagg consuming"  # logged once the stop handlers are installed


def start_running_daemon(config: Path, log: Path) -> subprocess.Popen[bytes]:
    """Start a daemon and wait until it runs: a stop sent while Python is still importing
    would end it by the default signal action, not test the daemon's stop."""
    before = log.read_text().count(_RUNNING_LINE) if log.exists() else 0
    daemon = start_daemon(config, log)
    wait_for(lambda: daemon.poll() is not None or log.read_text().count(_RUNNING_LINE) > before,
             timeout_s=60, what="the daemon to start")
    assert daemon.poll() is None, log.read_text()[-3000:]
    return daemon


class ParallelReader:
    """A second read_committed subscriber reading the output while the faults happen."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.frames: list[pl.DataFrame] = []
        self.starts: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(bootstrap, topic), daemon=True)
        self._thread.start()

    def _run(self, bootstrap: str, topic: str) -> None:
        reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"parallel-{topic}",
                           "auto.offset.reset": "earliest", "enable.auto.commit": False,
                           "isolation.level": "read_committed"})
        reader.subscribe([topic])
        try:
            while not self._stop.is_set():
                message = reader.poll(0.2)
                if message is None or message.error() is not None:
                    continue
                window = decode_output(message.value(), message.headers())
                self.frames.append(window.frame)
                self.starts.append(window.start_ms)
        finally:
            reader.close()

    def stop(self, messages: int) -> pl.DataFrame:
        """Stop once it has read ``messages`` output messages (what the final read saw)."""
        wait_for(lambda: len(self.starts) >= messages, timeout_s=30,
                 what=f"the parallel reader to read {messages} messages")
        self._stop.set()
        self._thread.join(30)
        frame = pl.concat(self.frames)
        return frame.with_columns(pl.col("window_start").dt.epoch("ms"))


def sorted_rows(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.drop("window_end").sort(["window_start", *KEYS])


def run_with_faults(bootstrap: str, config: Path, log: Path, data: list[tuple[int, pa.Table]],
                    *, stop_signal: signal.Signals, stops: int, rng: random.Random,
                    poison: Sequence[tuple[int, bytes]] = ()) -> list[int]:
    """Publish ``data`` in ``stops`` chunks (each followed by one ``poison`` message per
    partition given), stopping the daemon with ``stop_signal`` at a random moment after
    each and starting it again; returns the exit codes seen."""
    codes = []
    daemon = start_running_daemon(config, log)
    try:
        size = -(-len(data) // stops)  # contiguous chunks keep event time in order
        chunks = [data[i:i + size] for i in range(0, len(data), size)]
        for number, chunk in enumerate(chunks):
            publish_tables(bootstrap, config_source(config), chunk, producer_id=f"w{number}")
            publish_raw(bootstrap, config_source(config), poison)
            time.sleep(rng.uniform(0.3, _MAX_PAUSE_S))
            daemon.send_signal(stop_signal)
            codes.append(daemon.wait(30))
            daemon = start_running_daemon(config, log)
        # The rest consumed and the last windows closed on idleness: every input offset
        # committed (as the broker tells it, not a guess at how long that takes).
        source, group = config_source(config), config_group(config)
        wait_for(lambda: committed_offsets(bootstrap, group, source)
                 == end_offsets(bootstrap, source), timeout_s=60,
                 what="the daemon to commit the whole input",
                 seen=lambda: f"committed {committed_offsets(bootstrap, group, source)}, "
                              f"end {end_offsets(bootstrap, source)}; daemon log:\n"
                              f"{log.read_text()[-3000:]}")
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(30) == 0, log.read_text()[-3000:]
    finally:
        if daemon.poll() is None:
            daemon.kill()
    return codes


def publish_raw(bootstrap: str, topic: str, values: Sequence[tuple[int, bytes]]) -> None:
    if not values:
        return
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for partition, value in values:
        producer.produce(topic, value, partition=partition)
    assert producer.flush(30) == 0


def dead_letter_origins(bootstrap: str, dlq: str) -> list[tuple[int, int]]:
    """(original partition, original offset) of every committed DLQ record."""
    return [(int(r.headers["arrowagg.dlq.original-partition"]),
             int(r.headers["arrowagg.dlq.original-offset"]))
            for r in read_topic(bootstrap, dlq, 1)]


def config_source(config: Path) -> str:
    return str(yaml.safe_load(config.read_text())["input"]["topics"][0])


def config_group(config: Path) -> str:
    return str(yaml.safe_load(config.read_text())["kafka"]["group_id"])


def ordered_input(batches_per_producer: int) -> list[tuple[int, pa.Table]]:
    return make_input(batches_per_producer=batches_per_producer, producers=3, span_ms=30)


def test_twenty_sigkills_lose_nothing_and_duplicate_nothing(
    bootstrap: str, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    source, sink = topic_factory("in", partitions=3), topic_factory("out")
    dlq = topic_factory("dlq")
    config = write_config(tmp_path / "config.yaml", bootstrap, source, sink, f"g-{source}",
                          dlq_topic=dlq)
    log = tmp_path / "daemon.log"
    data = ordered_input(batches_per_producer=100)
    reader = ParallelReader(bootstrap, sink)
    poison = [(p, b"not an Arrow IPC stream") for p in range(3)]
    codes = run_with_faults(bootstrap, config, log, data, stop_signal=signal.SIGKILL, stops=20,
                            rng=random.Random(11), poison=poison)
    got, starts = output_frame(bootstrap, sink)
    seen_in_parallel = reader.stop(len(starts))
    expected = reference([t for _, t in data], SIZE_MS)
    dead = dead_letter_origins(bootstrap, dlq)
    write_figures("sigkill", {
        "sigkills": len(codes), "windows": len(starts), "rows": int(got["row_count"].sum()),
        "duplicates": len(starts) - len(set(starts)), "lost": len(expected) - got.height,
        "poison_sent": 20 * len(poison), "dead_letters": len(dead),
        "dead_letters_repeated": len(dead) - len(set(dead)),
    })
    assert codes == [-signal.SIGKILL] * 20
    assert len(set(dead)) == 20 * len(poison), "every poison message is dead-lettered"
    assert len(dead) == len(set(dead)), "a replay after a crash dead-lettered a message again"
    assert sorted(starts) == sorted(set(starts)), "a window was emitted twice"
    assert int(got["row_count"].sum()) == pa.concat_tables([t for _, t in data]).num_rows
    assert_frame_equal(sorted_rows(got), expected, check_exact=False, rel_tol=1e-9,
                       abs_tol=1e-9, check_dtypes=False)
    assert_frame_equal(sorted_rows(seen_in_parallel), sorted_rows(got))
    assert log.read_text().count("stopped cleanly") == 1


def test_sigterm_mid_stream_exits_0_and_the_restart_duplicates_nothing(
    bootstrap: str, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    source, sink = topic_factory("in", partitions=3), topic_factory("out")
    config = write_config(tmp_path / "config.yaml", bootstrap, source, sink, f"g-{source}")
    log = tmp_path / "daemon.log"
    data = ordered_input(batches_per_producer=45)
    started = time.monotonic()
    codes = run_with_faults(bootstrap, config, log, data, stop_signal=signal.SIGTERM, stops=3,
                            rng=random.Random(5))
    got, starts = output_frame(bootstrap, sink)
    print(f"sigterm: {len(codes)} clean stops in {time.monotonic() - started:.1f}s, "
          f"exit codes {codes}")
    assert codes == [0, 0, 0]
    assert sorted(starts) == sorted(set(starts)), "a window was emitted twice"
    assert_frame_equal(sorted_rows(got), reference([t for _, t in data], SIZE_MS),
                       check_exact=False, rel_tol=1e-9, abs_tol=1e-9, check_dtypes=False)
    assert log.read_text().count("stopped cleanly") == 4


def test_at_least_once_loses_nothing_and_repeats_only_whole_windows(
    bootstrap: str, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    source, sink = topic_factory("in", partitions=3), topic_factory("out")
    config = write_config(tmp_path / "config.yaml", bootstrap, source, sink, f"g-{source}",
                          guarantee="at_least_once")
    log = tmp_path / "daemon.log"
    data = ordered_input(batches_per_producer=60)
    kills = 5
    run_with_faults(bootstrap, config, log, data, stop_signal=signal.SIGKILL, stops=kills,
                    rng=random.Random(2))
    got, starts = output_frame(bootstrap, sink)
    repeated = len(starts) - len(set(starts))
    print(f"at-least-once: {kills} SIGKILLs, {len(set(starts))} windows, "
          f"{repeated} window messages repeated")
    # A repeated window is an identical copy (replay rebuilds it from the same input), so
    # dropping exact duplicates gives the reference; nothing is lost.
    deduplicated = got.unique(maintain_order=True)
    assert_frame_equal(sorted_rows(deduplicated), reference([t for _, t in data], SIZE_MS),
                       check_exact=False, rel_tol=1e-9, abs_tol=1e-9, check_dtypes=False)
    # Bounded: at most the windows of the one flush each crash interrupted.
    assert repeated <= kills * 2


