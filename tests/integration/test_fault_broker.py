"""The broker fails under a running daemon: stopped three times mid-run (SIGKILL, SIGTERM,
SIGKILL) and brought back on the same data and ports while a publisher keeps writing.
One daemon process rides every outage out; the committed output equals the reference,
no (window, keys) row twice, and no transaction is left hanging.

And what an outage (or any downtime) leaves behind, a backlog, is not idleness: a
partition whose messages wait on the broker must not be declared idle and its rows late.
"""

from __future__ import annotations

import random
import signal
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka.admin import AdminClient
from polars.testing import assert_frame_equal

from tests.conftest import TopicFactory
from tests.integration.broker_faults import (
    IDLE_TIMEOUT_MS,
    PARTITIONS,
    SPAN_MS,
    event_time_batches,
    stuck_daemon_report,
)
from tests.integration.conftest import (
    daemon_settings,
    publish_tables,
    running_daemon,
    wait_all_committed,
)
from tests.integration.daemon_runs import SIZE_MS, sorted_rows, start_daemon, write_config
from tests.integration.data import KEYS, T0, output_frame, reference, sensor_table
from tests.integration.faults import (
    DurablePublisher,
    LocalBroker,
    PacedPublishing,
    create_topics,
    end_offsets,
    group_committed,
    hanging_transactions,
    read_topic,
    repeated_groups,
    wait_until,
    write_figures,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STOPS = (signal.SIGKILL, signal.SIGTERM, signal.SIGKILL)


def broker_config(path: Path, bootstrap: str, source: str, sink: str, late: str) -> Path:
    write_config(path, bootstrap, source, sink, f"g-{source}")
    config: dict[str, Any] = yaml.safe_load(path.read_text())
    config["window"]["idle_timeout_ms"] = IDLE_TIMEOUT_MS
    config["output"]["late_topic"] = late
    path.write_text(yaml.safe_dump(config))
    return path


def test_three_broker_restarts_mid_run_lose_nothing_and_duplicate_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTHONFAULTHANDLER", "1")  # the daemon can dump its stacks
    broker = LocalBroker.start(tmp_path / "kafka")
    publishing: PacedPublishing | None = None
    daemon = None
    log = tmp_path / "daemon.log"
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 0})
        source, sink, late = "in-broker-faults", "out-broker-faults", "late-broker-faults"
        create_topics(admin, {source: PARTITIONS, sink: 1, late: 1})
        group = f"g-{source}"
        config = broker_config(tmp_path / "config.yaml", broker.bootstrap, source, sink, late)
        daemon = start_daemon(config, log)
        rng = random.Random(17)
        publisher = DurablePublisher(broker.bootstrap, source)
        publishing = PacedPublishing(publisher, event_time_batches(rng), pause_s=0.03)

        def committed() -> list[int]:
            return group_committed(broker.bootstrap, group, source, PARTITIONS)

        def exited() -> bool:
            return daemon is not None and daemon.poll() is not None

        def progressed(before: list[int]) -> bool:
            return exited() or any(n > b for n, b in zip(committed(), before, strict=True))

        wait_until(lambda: exited() or min(committed()) > 0, timeout_s=60,
                   what="the daemon's first commit on every partition")
        assert not exited(), f"the daemon exited:\n{log.read_text()[-4000:]}"
        outages, resumed = [], []
        for stop_signal in STOPS:
            time.sleep(rng.uniform(1.0, 2.5))  # mid-run: windows open, transactions going
            before = committed()
            outages.append(round(broker.restart(stop_signal, down_s=2.0), 1))
            try:
                resumed.append(round(wait_until(
                    partial(progressed, before), timeout_s=45,
                    what="the daemon to commit again after the broker came back"), 1))
            except AssertionError as err:
                pytest.fail(stuck_daemon_report(daemon, log, f"{stop_signal.name}: {err}"))
            assert not exited(), (f"the daemon exited during a broker outage ({stop_signal.name})"
                                  f":\n{log.read_text()[-4000:]}")
        publishing.stop()
        publishing = None
        real_batches = len(publisher.published)
        last_ms = T0 + (real_batches // PARTITIONS + 1) * SPAN_MS
        sentinel_ms = (last_ms // SIZE_MS + 5) * SIZE_MS  # moves every watermark past the rest
        for partition in range(PARTITIONS):
            publisher.publish(partition, sensor_table(rng, 1, sentinel_ms, 1))
        publisher.flush()
        sentinels = [end - 1 for end in end_offsets(admin, source, PARTITIONS)]
        wait_until(lambda: exited() or committed() == sentinels, timeout_s=60,
                   what="every window before the sentinels committed")
        assert not exited(), f"the daemon exited:\n{log.read_text()[-4000:]}"
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(30)
        assert code == 0, f"SIGTERM exit code {code}:\n{log.read_text()[-4000:]}"

        text = log.read_text()
        got, starts = output_frame(broker.bootstrap, sink)
        expected = reference([t for _, t in publisher.published[:real_batches]], SIZE_MS)
        late_records = read_topic(broker.bootstrap, late, 1, quiet_s=2.0)
        hanging = {t: hanging_transactions(admin, t, n)
                   for t, n in ((sink, 1), (late, 1))}
        window_keys = ["window_start", *KEYS]
        lost = expected.join(got.select(window_keys), on=window_keys, how="anti",
                             nulls_equal=True).height
        write_figures("broker_restarts", {
            "broker_stops": [s.name for s in STOPS], "outage_s": outages,
            "daemon_resumed_committing_after_s": resumed,
            "daemon_restarts": text.count("arrowagg consuming") - 1,
            "aborted_transactions": text.count("nothing committed"),
            "input_batches": real_batches, "input_rows": int(expected["row_count"].sum()),
            "windows": len(set(starts)), "output_rows": got.height,
            "duplicates": repeated_groups(got, KEYS), "lost": lost,
            "late_rows_published": len(late_records),
            "hanging_transactions": {t: h for t, h in hanging.items() if h},
        })
        assert text.count("arrowagg consuming") == 1, "the daemon was restarted"
        assert text.count("stopped cleanly") == 1
        assert repeated_groups(got, KEYS) == 0, "a (window, keys) row was emitted twice"
        assert late_records == [], "rows published during an outage were called late"
        assert_frame_equal(sorted_rows(got), expected, check_exact=False, rel_tol=1e-9,
                           abs_tol=1e-9, check_dtypes=False)
        assert hanging == {sink: {}, late: {}}, "a transaction was left open"
        assert int(got["row_count"].sum()) == sum(
            t.num_rows for _, t in publisher.published[:real_batches])
    finally:
        if publishing is not None:
            publishing.stop()
        if daemon is not None and daemon.poll() is None:
            daemon.kill()
            daemon.wait(10)
        broker.stop()


def test_a_backlog_is_not_idleness_no_row_turns_late(
    bootstrap: str, topic_factory: TopicFactory,
) -> None:
    """Two partitions with a backlog each, as a restart after downtime finds them. The
    consumer delivers one partition's backlog before the other's; the second has
    delivered nothing for longer than idle_timeout_ms, yet its rows are all on the
    broker, waiting: they must be aggregated, not called late."""
    source, sink = topic_factory("in", partitions=2), topic_factory("out")
    rng = random.Random(3)
    data = [(p, sensor_table(rng, 20, T0 + i * 10, 10)) for i in range(1500) for p in range(2)]
    publish_tables(bootstrap, source, data)
    settings = daemon_settings(bootstrap, source, sink, window={
        "kind": "tumbling", "time": "event", "timestamp_column": "ts", "size_ms": 1000,
        "idle_timeout_ms": 1000}, processing={"poll_max_messages": 100})
    rows = sum(t.num_rows for _, t in data)
    with running_daemon(settings) as daemon:
        counters = wait_all_committed(daemon, settings, rows=rows).counters
    got, _starts = output_frame(bootstrap, sink)
    write_figures("backlog", {"input_rows": rows, "late_rows": counters.late_rows,
                              "aggregated_rows": int(got["row_count"].sum())})
    assert counters.late_rows == 0, f"{counters.late_rows} of {rows} backlog rows called late"
    assert_frame_equal(sorted_rows(got), reference([t for _, t in data], 1000),
                       check_exact=False, rel_tol=1e-9, abs_tol=1e-9, check_dtypes=False)
