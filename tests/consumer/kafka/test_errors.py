"""How client errors are classified and worded for the one line that stops the daemon."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from consumer.kafka.errors import described, is_fatal, is_fenced


@pytest.mark.parametrize("error", [
    KafkaError(KafkaError.INVALID_PRODUCER_EPOCH, "Failed to commit offsets to transaction on "
               "broker b/1: in-0[0](Broker: Producer attempted an operation with an old "
               "epoch)", fatal=True),
    KafkaError(KafkaError.PRODUCER_FENCED, "Broker: There is a newer producer with the same "
               "transactionalId", fatal=True),
    KafkaError(KafkaError._FATAL, "Failed to commit offsets to transaction: in-0[0](Broker: "
               "Producer attempted an operation with an old epoch)", fatal=True),
])
def test_being_fenced_is_said_plainly_whatever_the_broker_said(error: KafkaError) -> None:
    line = described(error)
    assert line.startswith("fenced by a newer instance with the same transactional.id (")
    assert error.str() in line
    assert is_fenced(error)


def test_a_consumer_fenced_by_its_group_instance_id_says_so() -> None:
    error = KafkaError(KafkaError.FENCED_INSTANCE_ID, "Broker: Static consumer fenced by "
                       "other consumer with same group.instance.id")
    assert is_fatal(error)
    assert described(error) == error.str()
    worded_otherwise = KafkaError(KafkaError.FENCED_INSTANCE_ID, "Broker: member replaced")
    assert described(worded_otherwise) == ("fenced by a newer consumer with the same "
                                           "group.instance.id (Broker: member replaced)")


def test_a_message_that_says_fenced_already_is_left_as_it_is() -> None:
    error = KafkaError(KafkaError._FENCED, "Local: This instance has been fenced by a newer "
                       "instance", fatal=True)
    assert described(error) == error.str()


def test_other_fatal_errors_are_left_as_they_are() -> None:
    error = KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                       "Broker: Transactional Id authorization failed", fatal=True)
    assert described(error) == error.str()
    assert is_fatal(error)
    assert not is_fenced(error)


@pytest.mark.parametrize("code", [KafkaError._FATAL, KafkaError._FENCED,
                                  KafkaError.PRODUCER_FENCED, KafkaError.FENCED_INSTANCE_ID])
def test_fences_and_fatal_events_are_fatal_whatever_their_flag(code: int) -> None:
    assert is_fatal(KafkaError(code, fatal=False))


@pytest.mark.parametrize("code", [
    KafkaError._OUTDATED, KafkaError._STATE, KafkaError._UNKNOWN_PARTITION,
    KafkaError._PREV_IN_PROGRESS, KafkaError._TIMED_OUT, KafkaError.ILLEGAL_GENERATION,
    KafkaError.UNKNOWN_MEMBER_ID, KafkaError.REBALANCE_IN_PROGRESS,
    KafkaError.NOT_COORDINATOR,
])
def test_what_a_rebalance_answers_is_not_fatal(code: int) -> None:
    error = KafkaError(code)
    assert not is_fatal(error)
    assert not is_fenced(error)
