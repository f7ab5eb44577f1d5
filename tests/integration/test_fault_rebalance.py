"""Two daemon instances in one consumer group, one of them SIGKILLed and started again:
three rebalances mid-stream, and the two instances' output merged equals the reference.

What a multi-instance deployment guarantees: each instance aggregates the partitions it
owns, so a window's groups come from whichever instance owned their partition when the
window closed, each (window, keys) row exactly once. One output row per (window, keys)
across instances needs the input keyed by the group keys, as here: partition p carries
only site "site-p", so no group is split between instances.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient
from polars.testing import assert_frame_equal

from tests.conftest import TopicFactory
from tests.integration.conftest import publish_tables
from tests.integration.daemon_runs import SIZE_MS, sorted_rows, start_daemon, write_config
from tests.integration.data import KEYS, make_input, output_frame, reference
from tests.integration.faults import (
    end_offsets,
    group_committed,
    keyed_by_partition,
    late_rows_logged,
    repeated_groups,
    wait_until,
    write_figures,
)
from tests.integration.instances import owners

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 4

SPAN_MS = 30
# Between chunks the input pauses for longer than the idle timeout, so the open windows
# close on idleness: chunks end on window boundaries, or their next rows would be late.
BATCHES_PER_CHUNK = 40
assert BATCHES_PER_CHUNK * SPAN_MS % SIZE_MS == 0
# Static membership: a SIGKILLed member keeps its partitions until its session times out.
SESSION = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}


def keyed_chunks(chunks: int) -> list[list[tuple[int, pa.Table]]]:
    """Each partition in event-time order, carrying only its own site, in chunks."""
    keyed = keyed_by_partition(make_input(batches_per_producer=chunks * BATCHES_PER_CHUNK,
                                          producers=PARTITIONS, span_ms=SPAN_MS))
    size = BATCHES_PER_CHUNK * PARTITIONS
    return [keyed[i:i + size] for i in range(0, len(keyed), size)]


def test_two_instances_kill_and_restart_one_merge_to_the_reference(
    bootstrap: str, admin: AdminClient, topic_factory: TopicFactory, tmp_path: Path,
) -> None:
    source, sink = topic_factory("in", partitions=PARTITIONS), topic_factory("out")
    group = f"g-{source}"
    configs = {name: write_config(tmp_path / f"{name}.yaml", bootstrap, source, sink, group,
                                  instance_id=f"instance-{name}", consumer=SESSION)
               for name in ("a", "b")}
    logs = {name: tmp_path / f"{name}.log" for name in configs}
    chunks = keyed_chunks(3)
    data = [batch for chunk in chunks for batch in chunk]
    daemons: dict[str, subprocess.Popen[bytes]] = {}
    layouts: list[dict[str, list[int]]] = []
    settled_after_s: list[float] = []

    def wait_for_owners(count: int, what: str) -> None:
        def settled() -> bool:
            layout = owners(admin, group, source, PARTITIONS)
            return len(layout) == count and all(layout.values())
        settled_after_s.append(round(wait_until(settled, timeout_s=60, what=what), 1))
        layouts.append(owners(admin, group, source, PARTITIONS))

    try:
        daemons["a"] = start_daemon(configs["a"], logs["a"])
        wait_for_owners(1, "instance a to own every partition")
        publish_tables(bootstrap, source, chunks[0], producer_id="w1")
        time.sleep(1.0)
        daemons["b"] = start_daemon(configs["b"], logs["b"])
        wait_for_owners(2, "rebalance 1: instance b joining")
        publish_tables(bootstrap, source, chunks[1], producer_id="w2")
        time.sleep(0.5)  # b is mid-window: its last windows are open, uncommitted
        daemons["b"].send_signal(signal.SIGKILL)
        killed_exit = daemons["b"].wait(10)
        wait_for_owners(1, "rebalance 2: instance a taking b's partitions after its session")
        daemons["b"] = start_daemon(configs["b"], logs["b"])
        wait_for_owners(2, "rebalance 3: instance b back")
        publish_tables(bootstrap, source, chunks[2], producer_id="w3")
        ends = end_offsets(admin, source, PARTITIONS)
        wait_until(lambda: group_committed(bootstrap, group, source, PARTITIONS) == ends,
                   timeout_s=60, what="every window closed and committed")
        for daemon in daemons.values():
            daemon.send_signal(signal.SIGTERM)
        codes = {name: daemon.wait(30) for name, daemon in daemons.items()}
    finally:
        for daemon in daemons.values():
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait(10)

    got, starts = output_frame(bootstrap, sink)
    expected = reference([t for _, t in data], SIZE_MS)
    window_keys = ["window_start", *KEYS]
    lost = expected.join(got.select(window_keys), on=window_keys, how="anti",
                         nulls_equal=True).height
    write_figures("rebalance", {
        "instances": 2, "rebalances": 3, "sigkills": 1, "killed_exit": killed_exit,
        "sigterm_exits": codes, "assignments": layouts,
        "assignment_settled_after_s": settled_after_s,
        "window_messages": len(starts), "output_rows": got.height,
        "reference_rows": expected.height,
        "late_rows": late_rows_logged(*logs.values()),
        "duplicates": repeated_groups(got, KEYS), "lost": lost,
        "rows_in": sum(t.num_rows for _, t in data), "rows_out": int(got["row_count"].sum()),
    })
    assert killed_exit == -signal.SIGKILL
    assert codes == {"a": 0, "b": 0}, {n: logs[n].read_text()[-3000:] for n in logs}
    assert repeated_groups(got, KEYS) == 0, "a (window, keys) row was emitted twice"
    assert_frame_equal(sorted_rows(got), expected, check_exact=False, rel_tol=1e-9,
                       abs_tol=1e-9, check_dtypes=False)
