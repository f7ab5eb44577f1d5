"""How the run loop reads committed offsets between two polls, and how long it keeps
trying to rewind to them (consumer/kafka/processor.py's recovery)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from confluent_kafka import KafkaError

from consumer.kafka.errors import FatalKafkaError, described, is_fatal

log = logging.getLogger(__name__)

# How long the loop keeps trying to rewind (every turn) before it stops in one line: a
# rewind that fails is retried as soon as the assignment settles, which takes a
# rebalance, not minutes.
REWIND_GIVE_UP_MS = 120_000

# How long one read of the committed offsets may hold the loop (it runs between two polls:
# in the assignment callback, and in a rewind). With isolation.level=read_committed the
# group coordinator answers only once no transaction holds offsets of the partitions:
# after a takeover from an instance killed mid-transaction that is when the transaction
# times out (transaction.timeout.ms, 60 s), and without a coordinator it is never. A
# lookup that times out leaves the partitions to a rewind, tried again every turn (each
# turn polls): the loop keeps turning, well inside max.poll.interval.ms, until it reads.
COMMITTED_TIMEOUT_S = 2.0


class RewindAttempts:
    """Failed rewinds since the last one that worked: one warning, then a stop in one
    line once they are fatal or have failed for ``REWIND_GIVE_UP_MS``."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self._clock = clock
        self._failing_since: int | None = None

    def failed(self, error: KafkaError) -> None:
        """Note a failed rewind (to try again next turn), or raise FatalKafkaError."""
        now = self._clock()
        first = self._failing_since is None
        since = self._failing_since = self._failing_since or now
        if is_fatal(error) or now - since > REWIND_GIVE_UP_MS:
            raise FatalKafkaError(f"cannot rewind to the committed offsets: {described(error)}")
        # Offsets a transaction holds fail every lookup until it ends: one line.
        log.log(logging.WARNING if first else logging.DEBUG,
                "rewinding failed (%s); trying again every turn", error.str())

    def succeeded(self) -> None:
        if self._failing_since is not None:
            log.info("rewound after %.1f s of failed attempts",
                     (self._clock() - self._failing_since) / 1000)
        self._failing_since = None
