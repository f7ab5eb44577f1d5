"""The sinks answer each transactional call's errors by kind, on the in-memory broker:
abortable -> abort and replay; unknown outcome or state -> a new producer and replay;
fatal or fenced -> stop in one line, never a new producer that would fence the instance
that took over."""

from __future__ import annotations

import polars as pl
import pytest
from confluent_kafka import KafkaError
from polars.testing import assert_frame_equal

from consumer.kafka.errors import FatalKafkaError
from tests.consumer.kafka.rig import (
    P0,
    P1,
    SIZE_MS,
    Rig,
    SinkKind,
    batch,
    closed_output_is_exact,
    publish_windows,
    reference,
    sorted_output,
)


def transactional_rig(sink: SinkKind = "transactional") -> Rig:
    rig = Rig(sink=sink)
    rig.consumer.rebalance("assign", [P0, P1])
    return rig


@pytest.mark.parametrize("code", [
    KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID,
    # What the offsets get when our own consumer rejoined the group with a new member id
    # (after a broker restart, say): librdkafka makes it abortable, not fatal.
    KafkaError.FENCED_INSTANCE_ID,
])
@pytest.mark.parametrize("call", ["begin_transaction", "produce",
                                  "send_offsets_to_transaction", "commit_transaction"])
def test_an_abortable_error_aborts_and_replays(call: str, code: int) -> None:
    rig = transactional_rig()
    publish_windows(rig, range(2))
    rig.consumer.fail(call, KafkaError(code, txn_requires_abort=True))
    rig.turns(3)
    assert rig.processor.counters.aborts == 1
    assert "abort_transaction" in rig.producers[0].calls
    assert len(rig.producers) == 1
    closed_output_is_exact(rig, before_ms=2 * SIZE_MS)


@pytest.mark.parametrize("error", [
    KafkaError(KafkaError._TIMED_OUT, retriable=True),  # the outcome of the commit is unknown
    KafkaError(KafkaError._STATE),  # the producer is in a state it should not be in
    KafkaError(KafkaError._PREV_IN_PROGRESS),
])
def test_an_unknown_outcome_makes_a_new_producer_and_replays(error: KafkaError) -> None:
    rig = transactional_rig()
    publish_windows(rig, range(2))
    rig.consumer.fail("commit_transaction", error, times=5 if error.retriable() else 1)
    rig.turns(3)
    assert len(rig.producers) == 2
    assert rig.producers[1].calls[0] == "init_transactions"
    closed_output_is_exact(rig, before_ms=2 * SIZE_MS)


def test_a_retriable_error_is_retried_in_place() -> None:
    rig = transactional_rig()
    publish_windows(rig, range(2))
    rig.consumer.fail("send_offsets_to_transaction",
                      KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, retriable=True))
    rig.turns(3)
    assert len(rig.producers) == 1
    assert rig.processor.counters.aborts == 0
    closed_output_is_exact(rig, before_ms=2 * SIZE_MS)


@pytest.mark.parametrize("error", [
    KafkaError(KafkaError.PRODUCER_FENCED, fatal=True),
    KafkaError(KafkaError._FENCED, fatal=True),
    # Not flagged fatal, not abortable: still a fence, never answered by a new producer.
    KafkaError(KafkaError.INVALID_PRODUCER_EPOCH),
])
def test_a_fenced_producer_stops_without_fencing_back(error: KafkaError) -> None:
    rig = transactional_rig()
    publish_windows(rig, range(2))
    rig.consumer.fail("commit_transaction", error)
    with pytest.raises(FatalKafkaError, match="fenced") as raised:
        rig.processor.run()
    assert raised.value.exit_code == 1
    assert len(rig.producers) == 1
    assert rig.consumer.closed


def test_a_failing_abort_is_retried_then_answered_by_a_new_producer() -> None:
    rig = transactional_rig()
    publish_windows(rig, range(2))
    rig.consumer.fail("commit_transaction",
                      KafkaError(KafkaError.ILLEGAL_GENERATION, txn_requires_abort=True))
    rig.consumer.fail("abort_transaction", KafkaError(KafkaError._TIMED_OUT, retriable=True))
    rig.consumer.fail("abort_transaction", KafkaError(KafkaError._STATE))
    rig.turns(3)
    assert rig.producers[0].calls.count("abort_transaction") == 2
    assert len(rig.producers) == 2
    closed_output_is_exact(rig, before_ms=2 * SIZE_MS)


def test_a_fenced_abort_stops() -> None:
    rig = transactional_rig()
    publish_windows(rig, range(2))
    rig.consumer.fail("commit_transaction",
                      KafkaError(KafkaError.ILLEGAL_GENERATION, txn_requires_abort=True))
    rig.consumer.fail("abort_transaction", KafkaError(KafkaError.PRODUCER_FENCED, fatal=True))
    with pytest.raises(FatalKafkaError, match=r"abort failed: .*fence"):
        rig.processor.run()


def test_a_new_producer_fenced_at_its_start_stops_in_one_line() -> None:
    rig = transactional_rig()
    publish_windows(rig, range(2))
    rig.consumer.fail("commit_transaction", KafkaError(KafkaError._STATE))
    rig.consumer.fail("init_transactions", KafkaError(KafkaError.PRODUCER_FENCED, fatal=True))
    with pytest.raises(FatalKafkaError, match=r"cannot start a transactional producer: .*fence"):
        rig.processor.run()


@pytest.mark.parametrize("code", [KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID,
                                  KafkaError.REBALANCE_IN_PROGRESS])
def test_at_least_once_a_refused_offset_commit_replays_and_loses_nothing(code: int) -> None:
    rig = transactional_rig("at_least_once")
    publish_windows(rig, range(2))
    rig.consumer.fail("commit", code)
    rig.turns(3)
    for partition in (0, 1):
        rig.publish(partition, batch(2 * SIZE_MS + 500))
    rig.turns(12)
    assert rig.processor.counters.aborts == 1
    # The flush whose offsets were refused is delivered again, in identical copies.
    got = sorted_output(rig)
    assert got.height > got.unique().height
    expected = reference(rig.published).filter(pl.col("window_start") < 2 * SIZE_MS)
    assert_frame_equal(got.unique().sort("window_start", "site"), expected,
                       check_dtypes=False)


def test_at_least_once_a_fenced_offset_commit_stops() -> None:
    rig = transactional_rig("at_least_once")
    publish_windows(rig, range(2))
    rig.consumer.fail("commit", KafkaError.FENCED_INSTANCE_ID)
    with pytest.raises(FatalKafkaError, match=r"offset commit failed: .*fenced"):
        rig.processor.run()
