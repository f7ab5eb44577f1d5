"""How the transactional sink words the errors that stop the daemon."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from consumer.kafka.sink import _described


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
    line = _described(error)
    assert line.startswith("fenced by a newer instance with the same transactional.id (")
    assert error.str() in line


def test_a_message_that_says_fenced_already_is_left_as_it_is() -> None:
    error = KafkaError(KafkaError._FENCED, "Local: This instance has been fenced by a newer "
                       "instance", fatal=True)
    assert _described(error) == error.str()


def test_other_fatal_errors_are_left_as_they_are() -> None:
    error = KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                       "Broker: Transactional Id authorization failed", fatal=True)
    assert _described(error) == error.str()
