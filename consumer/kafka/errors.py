"""What a Kafka client's error means to the run loop, decided in one place.

Every broker call the loop makes can meet a rebalance, a lost assignment, a fence or a
broker failover half-way: a seek answers ``_OUTDATED``, ``_STATE`` or
``_UNKNOWN_PARTITION`` when the partition's assignment changed under it, a commit
``ILLEGAL_GENERATION`` after the group moved on. docs/reliability.md ("Broker calls and
their errors") lists each call with its answer, one of four:

- *skip*: the partition is no longer ours (or not yet); the revoke, the lost assignment
  or the next assignment deals with it;
- *retry*: the client says the error is retriable; ask again;
- *rewind*: throw the window state away and replay from the committed offsets on the
  next turn, which is right whatever happened to the assignment meanwhile;
- *stop*: the client cannot go on: one line, exit code 1; a fenced instance says so.
"""

from __future__ import annotations

from typing import ClassVar

from confluent_kafka import KafkaError

from wire.errors import ArrowaggError

# What the broker and librdkafka say, in some order, when a newer instance has taken over
# our transactional.id (a restarted instance, or a second one with the same id) or our
# group.instance.id.
_FENCED = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                     KafkaError.INVALID_PRODUCER_EPOCH, KafkaError.FENCED_INSTANCE_ID})


class FatalKafkaError(ArrowaggError):
    """The client cannot go on (fenced by a newer instance, or a fatal client error)."""

    headline: ClassVar[str] = "stopping on a fatal Kafka error: "


def is_fatal(error: KafkaError) -> bool:
    """The client cannot go on. A consumer's fatal error (a static member fenced by another
    with the same group.instance.id) arrives as an error of code _FATAL whose fatal() is
    False: left as a warning, it kept a dead consumer's daemon running."""
    return error.fatal() or error.code() in (KafkaError._FATAL, KafkaError._FENCED,
                                             KafkaError.PRODUCER_FENCED,
                                             KafkaError.FENCED_INSTANCE_ID)


def is_fenced(error: KafkaError) -> bool:
    """A newer instance has our id. Never answered with a new producer of the same
    transactional.id: that would fence the instance that took over, which would fence
    us back in turn."""
    return error.code() in _FENCED or "old epoch" in error.str()


def described(error: KafkaError) -> str:
    """The error's text, saying plainly when it means we were fenced."""
    text = error.str()
    if "fenced" in text:
        return text
    if error.code() == KafkaError.FENCED_INSTANCE_ID:
        return f"fenced by a newer consumer with the same group.instance.id ({text})"
    if is_fenced(error):
        return f"fenced by a newer instance with the same transactional.id ({text})"
    return text


def stop_if_fatal(error: KafkaError, client: str) -> None:
    """Raise FatalKafkaError if ``error`` is fatal; the caller skips the others."""
    if is_fatal(error):
        raise FatalKafkaError(f"from the {client}: {described(error)}")
