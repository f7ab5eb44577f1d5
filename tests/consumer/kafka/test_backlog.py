"""The backlog check (consumer/kafka/backlog.py) in the run loop, against an in-memory
broker whose fetcher can be stopped the way a SIGSTOP stops the real one: a partition
with input waiting on the broker keeps its windows open, even when the client's cache
of the partition's end predates the stop (the same path runs against a real broker in
tests/integration/test_fault_zombies.py)."""

from __future__ import annotations

from confluent_kafka import KafkaError, TopicPartition
from polars.testing import assert_frame_equal

from tests.consumer.kafka.rig import P0, P1, Rig, batch, reference, sorted_output


def stopped_while_input_arrives(rig: Rig, *, stopped_ms: int) -> None:
    """Window 0 open with one poll read; then the process stops for ``stopped_ms`` (its
    fetcher with it) while the rest of window 0 and window 1 arrive on the broker."""
    rig.publish(0, batch(100))
    rig.turns(2)
    assert rig.pipeline.open_windows() == 1
    rig.consumer.stop_fetching()
    rig.publish(0, batch(500))
    rig.publish(0, batch(1_100))
    rig.clock.now_ms += stopped_ms


def test_a_process_stopped_past_the_idle_timeout_asks_the_broker_and_turns_nothing_late(
) -> None:
    rig = Rig(1, window={"idle_timeout_ms": 3_000})
    rig.consumer.rebalance("assign", [P0])
    stopped_while_input_arrives(rig, stopped_ms=8_000)
    rig.processor.run_once()  # woken: the fetcher has not run, its cache predates the stop
    assert rig.consumer.broker_queries == [P0]
    assert rig.pipeline.open_windows() == 1, "window 0 waits for the backlog"
    rig.consumer.resume_fetching()
    rig.turns(3)
    rig.clock.now_ms += 3_000  # input over: idle, every window closes
    rig.turns(2)
    assert rig.pipeline.counters.late_rows == 0
    assert_frame_equal(sorted_output(rig), reference(rig.published))


def test_backlog_checks_a_turn_apart_trust_the_client_cache() -> None:
    rig = Rig(1, window={"idle_timeout_ms": 3_000})
    rig.consumer.rebalance("assign", [P0])
    for ts in (100, 500, 1_100, 2_100):
        rig.publish(0, batch(ts))
        rig.turns(3)
    rig.turns(40)  # 4 s of quiet turns: idle, every window closes
    assert rig.consumer.broker_queries == []
    assert_frame_equal(sorted_output(rig), reference(rig.published))


def test_a_broker_that_cannot_say_its_end_after_a_stop_holds_the_windows_a_turn() -> None:
    rig = Rig(2, window={"idle_timeout_ms": 3_000})
    rig.consumer.rebalance("assign", [P0, P1])
    stopped_while_input_arrives(rig, stopped_ms=8_000)
    rig.consumer.fail("query_watermark_offsets", KafkaError._TIMED_OUT)
    rig.processor.run_once()  # the cache is stale and the broker does not answer
    assert rig.consumer.broker_queries == [], "one timed-out lookup a turn, not one each"
    assert rig.pipeline.open_windows() == 1
    rig.consumer.resume_fetching()
    rig.turns(3)
    rig.clock.now_ms += 3_000
    rig.turns(2)
    assert rig.consumer.failures.raised == [("query_watermark_offsets", KafkaError._TIMED_OUT)]
    assert rig.pipeline.counters.late_rows == 0
    assert_frame_equal(sorted_output(rig), reference(rig.published))


def test_a_stall_after_the_backlog_check_closes_no_window_on_its_answer() -> None:
    """The check says "no backlog" at one instant; the flush must judge idleness at that
    instant, not after a stall between the two in which input arrived."""
    rig = Rig(1, window={"idle_timeout_ms": 3_000})
    rig.consumer.rebalance("assign", [P0])
    rig.publish(0, batch(100))
    rig.turns(2)
    assert rig.pipeline.open_windows() == 1
    answer_from_cache = rig.consumer.get_watermark_offsets

    def answered_then_stalled(partition: TopicPartition, timeout: float = -1,
                              cached: bool = False) -> tuple[int, int]:
        ends = answer_from_cache(partition, timeout, cached)
        rig.consumer.get_watermark_offsets = answer_from_cache  # type: ignore[method-assign]
        rig.clock.now_ms += 8_000  # stopped right after the answer
        rig.publish(0, batch(500))  # window 0's rest arrives meanwhile
        return ends

    rig.consumer.get_watermark_offsets = answered_then_stalled  # type: ignore[method-assign]
    rig.processor.run_once()
    assert rig.pipeline.open_windows() == 1, "idle judged after the stall, not at the check"
    rig.turns(3)
    rig.clock.now_ms += 3_000  # input over: idle, every window closes
    rig.turns(2)
    assert rig.pipeline.counters.late_rows == 0
    assert_frame_equal(sorted_output(rig), reference(rig.published))
