"""Transactions under faults, through Apache Kafka: a crash between produce and commit
leaves nothing visible to read_committed readers and no hanging transaction; a crash
after sending the offsets holds them back from the next owner, which keeps turning."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence
from itertools import pairwise

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, IsolationLevel, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec
from polars.testing import assert_frame_equal

from consumer.compose import build_processor
from consumer.config import Settings
from consumer.core.types import OutputRecord
from consumer.kafka.clients import InputConsumer, producer_config
from consumer.kafka.sink import TransactionalSink
from consumer.service.observer import NullObserver
from tests.conftest import TopicFactory
from tests.integration.conftest import (
    daemon_settings,
    publish_tables,
    running_daemon,
    wait_all_committed,
)
from tests.integration.daemon_runs import SIZE_MS
from tests.integration.data import KEYS, make_input, output_frame, reference
from tests.integration.faults import write_figures

pytestmark = [pytest.mark.integration, pytest.mark.slow]


class ProcessDiedError(BaseException):
    """Stands for the process dying: nothing after it runs, not even an abort."""


class DiesBeforeCommit(TransactionalSink):
    """Produces the first transaction that holds windows, then dies before committing it."""

    def __init__(self, config: dict[str, object], output_topic: str) -> None:
        super().__init__(config)
        self._output_topic = output_topic
        self.died = threading.Event()

    def flush(self, records: Sequence[OutputRecord], offsets: Sequence[TopicPartition],
              consumer: InputConsumer) -> None:
        if self.died.is_set() or not any(r.topic == self._output_topic for r in records):
            super().flush(records, offsets, consumer)
            return
        producer = self._producer
        producer.begin_transaction()
        for record in records:
            producer.produce(record.topic, record.value, record.key, headers=list(record.headers))
        producer.flush(10)  # the records reach the broker; the commit never does
        self.died.set()
        raise ProcessDiedError

    def close(self) -> None:
        """A dead process closes nothing."""


def _published(bootstrap: str, topic_factory: TopicFactory, *, batches_per_producer: int,
               ) -> tuple[str, str, Settings, list[tuple[int, pa.Table]]]:
    """An input topic of two partitions holding two producers' batches, an output topic,
    and the settings of a daemon with tumbling windows between them."""
    source, sink = topic_factory("in", partitions=2), topic_factory("out")
    settings = daemon_settings(bootstrap, source, sink, window={
        "kind": "tumbling", "time": "event", "timestamp_column": "ts", "size_ms": SIZE_MS,
        "idle_timeout_ms": 1500})
    data = make_input(batches_per_producer=batches_per_producer, producers=2, span_ms=30)
    publish_tables(bootstrap, source, data)
    return source, sink, settings, data


def count_visible(bootstrap: str, topic: str, isolation: str) -> int:
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"v-{uuid.uuid4().hex}",
                       "auto.offset.reset": "earliest", "isolation.level": isolation})
    reader.subscribe([topic])
    seen = 0
    try:
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            message = reader.poll(0.2)
            if message is not None and message.error() is None:
                seen += 1
    finally:
        reader.close()
    return seen


def stable_equals_high_watermark(admin: AdminClient, topic: str, partitions: int) -> bool:
    """No hanging transaction: per partition, the last stable offset is the high watermark."""
    def latest(isolation: IsolationLevel) -> list[int]:
        request = {TopicPartition(topic, p): OffsetSpec.latest()  # type: ignore[no-untyped-call]
                   for p in range(partitions)}
        futures = admin.list_offsets(request, isolation_level=isolation)
        return [futures[tp].result(30).offset for tp in sorted(futures, key=lambda t: t.partition)]
    return latest(IsolationLevel.READ_COMMITTED) == latest(IsolationLevel.READ_UNCOMMITTED)


def test_crash_between_produce_and_commit_is_invisible_and_leaves_no_hanging_transaction(
    bootstrap: str, topic_factory: TopicFactory, admin: AdminClient
) -> None:
    _, sink, settings, data = _published(bootstrap, topic_factory, batches_per_producer=40)

    dying = DiesBeforeCommit(producer_config(settings.kafka, settings.processing), sink)
    first = build_processor(settings, sink=dying)
    def run_until_it_dies() -> None:
        with pytest.raises(ProcessDiedError):
            first.run()

    thread = threading.Thread(target=run_until_it_dies, daemon=True)
    thread.start()
    thread.join(60)
    assert dying.died.is_set()
    pending = count_visible(bootstrap, sink, "read_uncommitted")
    hidden = count_visible(bootstrap, sink, "read_committed")
    print(f"crash before commit: read_uncommitted sees {pending} pending records, "
          f"read_committed {hidden}")
    assert pending > 0
    assert hidden == 0

    # The restarted instance (same transactional.id) fences the dead one's transaction.
    with running_daemon(settings) as daemon:
        wait_all_committed(daemon, settings, rows=sum(t.num_rows for _, t in data))
    got, starts = output_frame(bootstrap, sink)
    assert sorted(starts) == sorted(set(starts)), "a window was committed twice"
    assert_frame_equal(got.drop("window_end").sort(["window_start", *KEYS]),
                       reference([t for _, t in data], SIZE_MS), check_exact=False,
                       rel_tol=1e-9, abs_tol=1e-9, check_dtypes=False)
    assert stable_equals_high_watermark(admin, sink, partitions=1)
    del dying  # the zombie producer goes only now, after the checks


class TurnTimes(NullObserver):
    def __init__(self) -> None:
        self.at: list[float] = []
        self.assigned_at: list[float] = []

    def loop_turned(self, now_ms: int) -> None:
        del now_ms
        self.at.append(time.monotonic())

    def assigned(self, partitions: Sequence[tuple[str, int]]) -> None:
        del partitions
        self.assigned_at.append(time.monotonic())


# The dead instance's transaction: aborted by the broker this long (plus its clean-up
# interval, up to 10 s) after it began.
DEAD_TRANSACTION_MS = 15_000


def test_offsets_held_by_a_dead_instances_transaction_never_stall_the_new_owner(
    bootstrap: str, topic_factory: TopicFactory,
) -> None:
    """An instance dies after sending its offsets to a transaction: until the broker
    aborts that transaction, the group coordinator holds the partitions' committed offsets
    back from read_committed lookups, and librdkafka's ``committed`` waits out its whole
    timeout. The daemon taking its partitions over must keep polling and turning
    (``/healthz``) meanwhile, then read the offsets and aggregate everything once."""
    source, sink, settings, data = _published(bootstrap, topic_factory,
                                              batches_per_producer=20)
    group = settings.kafka.group_id
    member = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                       "isolation.level": "read_committed", "enable.auto.commit": False,
                       "partition.assignment.strategy": "cooperative-sticky"})
    member.subscribe([source])
    deadline = time.monotonic() + 30
    while len(member.assignment()) < 2 and time.monotonic() < deadline:
        member.poll(0.2)
    dead = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{group}-dead",
                     "transaction.timeout.ms": DEAD_TRANSACTION_MS})
    dead.init_transactions(30)
    dead.begin_transaction()
    dead.send_offsets_to_transaction([TopicPartition(source, p, 0) for p in (0, 1)],
                                     member.consumer_group_metadata(), 30)

    turns = TurnTimes()
    started = time.monotonic()
    with running_daemon(settings, turns) as daemon:
        while len(turns.at) < 10 and time.monotonic() - started < 30:
            member.poll(0.1)  # the daemon turns, joining; the member keeps its share
        member.close()  # and dies: its transaction stays open, as a SIGKILL leaves it
        wait_all_committed(daemon, settings, rows=sum(t.num_rows for _, t in data),
                           timeout_s=90)
    got, starts = output_frame(bootstrap, sink)
    longest = max(later - earlier for earlier, later in pairwise(turns.at))
    write_figures("dead_transaction_takeover", {
        "longest_s_between_turns": round(longest, 1),
        "all_committed_after_s": round(time.monotonic() - started, 1),
        "dead_transaction_timeout_ms": DEAD_TRANSACTION_MS})
    assert turns.at[0] < turns.assigned_at[0], "assigned before the loop first turned"
    assert longest < 5.0, f"the loop did not turn for {longest:.1f}s"
    assert sorted(starts) == sorted(set(starts)), "a window was committed twice"
    assert_frame_equal(got.drop("window_end").sort(["window_start", *KEYS]),
                       reference([t for _, t in data], SIZE_MS), check_exact=False,
                       rel_tol=1e-9, abs_tol=1e-9, check_dtypes=False)
    del dead  # it goes only now: its transaction must stay open through the takeover
