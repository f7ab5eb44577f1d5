"""Every broker call of the run loop meets the errors a rebalance, a lost assignment, a
fence or a failover make librdkafka answer, on the in-memory broker: the loop goes on
(skipping, retrying or rewinding) and its output stays exact, or it stops with one line
that says why (docs/reliability.md, "Broker calls and their errors")."""

from __future__ import annotations

import random
from itertools import pairwise
from typing import Literal

import pytest
from confluent_kafka import KafkaError

from consumer.kafka.errors import FatalKafkaError
from consumer.kafka.rewind import REWIND_GIVE_UP_MS
from consumer.service.observer import NullObserver
from tests.consumer.kafka.rig import (
    P0,
    P1,
    SINK,
    SIZE_MS,
    Rig,
    SinkKind,
    batch,
    closed_output_is_exact,
    publish_windows,
)

# What librdkafka answers when the assignment changed under a call.
ASSIGNMENT_CHANGED = [KafkaError._OUTDATED, KafkaError._STATE, KafkaError._UNKNOWN_PARTITION,
                      KafkaError._PREV_IN_PROGRESS]
COORDINATOR_MOVING = [KafkaError._TIMED_OUT, KafkaError.NOT_COORDINATOR,
                      KafkaError.COORDINATOR_LOAD_IN_PROGRESS]


def assigned_rig(*, sink: SinkKind = "fake", input: dict[str, object] | None = None,  # noqa: A002
                 processing: dict[str, object] | None = None) -> Rig:
    rig = Rig(sink=sink, input=input or {}, processing=processing or {})
    rig.consumer.rebalance("assign", [P0, P1])
    return rig


@pytest.mark.parametrize("code", ASSIGNMENT_CHANGED)
def test_a_failed_rewind_seek_is_retried_on_the_next_turn(code: int) -> None:
    rig = assigned_rig()
    publish_windows(rig, range(3))
    rig.turns(2)
    rig.consumer.fail("seek", code)
    rig.consumer.rebalance("revoke", [P1])  # we keep p0: its state is rebuilt by a rewind
    rig.turns(1)
    assert rig.consumer.failures.raised == [("seek", code)]
    rig.consumer.rebalance("assign", [P1])
    publish_windows(rig, range(3, 5))
    closed_output_is_exact(rig, before_ms=5 * SIZE_MS)


@pytest.mark.parametrize("code", ASSIGNMENT_CHANGED)
def test_a_failed_seek_back_of_a_paused_partition_rewinds_instead_of_skipping(
    code: int,
) -> None:
    # p0 runs ahead and is paused at 80% of 30 groups; librdkafka still hands over one
    # more of its messages, whose seek back fails: it must be read again, not lost.
    rig = assigned_rig(input={"max_groups": 30, "over_budget": "pause"},
                       processing={"poll_max_messages": 1})
    rig.publish(1, batch(100))
    for window in range(12):
        rig.publish(0, batch(window * SIZE_MS + 500))
    rig.turns(8)
    assert rig.consumer.paused == {P0}
    rig.consumer.leak_paused = True
    rig.consumer.fail("seek", code)
    rig.turns(1)
    rig.consumer.leak_paused = False
    assert ("seek", code) in rig.consumer.failures.raised
    rig.publish(1, batch(9_000))
    rig.turns(40)
    closed_output_is_exact(rig, before_ms=20_000)


@pytest.mark.parametrize("code", COORDINATOR_MOVING)
def test_committed_offsets_unreadable_at_assignment_are_read_by_a_rewind(code: int) -> None:
    rig = Rig()
    publish_windows(rig, range(2))
    rig.consumer.fail("committed", code)
    rig.consumer.rebalance("assign", [P0, P1])
    rig.turns(2)
    assert rig.consumer.callback_errors == []
    assert rig.consumer.failures.raised == [("committed", code)]
    closed_output_is_exact(rig, before_ms=2 * SIZE_MS)


class TurnTimes(NullObserver):
    def __init__(self) -> None:
        self.at: list[int] = []

    def loop_turned(self, now_ms: int) -> None:
        self.at.append(now_ms)


def longest_gap(times: list[int]) -> int:
    return max(later - earlier for earlier, later in pairwise(times))


# The fault tests' max.poll.interval.ms, the shortest the daemon is run with.
MAX_POLL_INTERVAL_MS = 8_000


@pytest.mark.parametrize("rebalance", ["assign", "lost"])
def test_offsets_held_by_a_dead_instances_transaction_never_stall_the_loop(
    rebalance: Literal["assign", "lost"],
) -> None:
    """A takeover from an instance killed mid-transaction: until its transaction times out
    (transaction.timeout.ms, 60 s) the coordinator holds the partitions' committed offsets
    back (read_committed), and librdkafka's ``committed`` waits out its whole timeout.
    Read in the assignment callback and again by the rewind, with a 30 s timeout, that
    held the loop a minute between two polls. It must keep polling and turning, read the
    offsets once they are stable, and lose nothing."""
    turns = TurnTimes()
    rig = Rig(observer=turns)
    publish_windows(rig, range(2))
    if rebalance == "assign":  # taking partitions over
        rig.turns(2)
    else:  # losing a partition: the rewind of the one kept reads its offsets
        rig.consumer.rebalance("assign", [P0, P1])
        rig.turns(2)
    stable_at = rig.clock.now_ms + 60_000
    rig.consumer.offsets_unstable_until_ms = stable_at
    rig.consumer.rebalance(rebalance, [P0, P1] if rebalance == "assign" else [P1])
    while rig.clock.now_ms < stable_at + 1_000:
        rig.turns(1)
    assert longest_gap(rig.consumer.polled_at) < MAX_POLL_INTERVAL_MS / 2
    assert longest_gap(turns.at) < MAX_POLL_INTERVAL_MS / 2  # what /healthz sees
    assert rig.consumer.failures.raised.count(("committed", KafkaError._TIMED_OUT)) >= 2
    assert rig.consumer.callback_errors == []
    if rebalance == "lost":
        rig.consumer.rebalance("assign", [P1])
    closed_output_is_exact(rig, before_ms=2 * SIZE_MS)


@pytest.mark.parametrize("call", ["committed", "assignment"])
def test_a_rewind_that_cannot_read_the_commits_waits_for_the_next_turn(call: str) -> None:
    rig = assigned_rig()
    publish_windows(rig, range(3))
    rig.turns(2)
    rig.consumer.fail(call, KafkaError._TIMED_OUT, times=2)
    rig.consumer.rebalance("lost", [P1])
    rig.turns(3)
    assert rig.consumer.failures.raised == [(call, KafkaError._TIMED_OUT)] * 2
    rig.consumer.rebalance("assign", [P1])
    closed_output_is_exact(rig, before_ms=3 * SIZE_MS)


def test_a_rewind_failing_for_minutes_stops_in_one_line() -> None:
    rig = assigned_rig()
    publish_windows(rig, range(2))
    rig.turns(2)
    rig.consumer.fail("committed", KafkaError._TIMED_OUT, times=1_000)
    rig.consumer.rebalance("lost", [P1])
    rig.turns(1)
    rig.clock.now_ms += REWIND_GIVE_UP_MS + 1
    with pytest.raises(FatalKafkaError, match="cannot rewind to the committed offsets"):
        rig.turns(1)


@pytest.mark.parametrize("call", ["position", "get_watermark_offsets"])
@pytest.mark.parametrize("code", [KafkaError._UNKNOWN_PARTITION, KafkaError._STATE])
def test_a_backlog_that_cannot_be_read_is_skipped_for_a_turn(call: str, code: int) -> None:
    rig = assigned_rig()
    publish_windows(rig, range(3))
    rig.consumer.fail(call, code, times=3)
    rig.turns(4)
    assert rig.consumer.failures.raised == [(call, code)] * 3
    closed_output_is_exact(rig, before_ms=3 * SIZE_MS)


@pytest.mark.parametrize("call", ["pause", "resume"])
def test_a_pause_or_resume_that_fails_rewinds_and_loses_nothing(call: str) -> None:
    rig = assigned_rig(input={"max_groups": 30, "over_budget": "pause"},
                       processing={"poll_max_messages": 1})
    rig.consumer.fail(call, KafkaError._STATE)
    rig.publish(1, batch(100))
    for window in range(12):
        rig.publish(0, batch(window * SIZE_MS + 500))
    rig.turns(10)
    rig.publish(1, batch(9_000))
    rig.turns(40)
    assert rig.consumer.failures.raised == [(call, KafkaError._STATE)]
    closed_output_is_exact(rig, before_ms=20_000)


@pytest.mark.parametrize("call", ["consume", "poll"])
def test_a_poll_that_fails_retriably_is_a_turn_with_nothing(call: str) -> None:
    rig = assigned_rig()
    publish_windows(rig, range(2))
    rig.consumer.fail(call, KafkaError(KafkaError._TRANSPORT, retriable=True))
    rig.turns(2)
    assert rig.consumer.failures.raised == [(call, KafkaError._TRANSPORT)]
    closed_output_is_exact(rig, before_ms=2 * SIZE_MS)


@pytest.mark.parametrize(("call", "rebalance"), [
    ("consume", None), ("committed", "assign"), ("seek", "revoke"), ("position", None),
])
def test_a_fenced_consumer_stops_in_one_line_whatever_call_meets_it(
    call: str, rebalance: str | None,
) -> None:
    rig = Rig() if rebalance == "assign" else assigned_rig()
    publish_windows(rig, range(2))
    rig.turns(1)
    rig.consumer.fail(call, KafkaError(KafkaError.FENCED_INSTANCE_ID))
    if rebalance == "assign":
        rig.consumer.rebalance("assign", [P0, P1])
    elif rebalance == "revoke":
        rig.consumer.rebalance("revoke", [P1])
    with pytest.raises(FatalKafkaError, match="fenced") as raised:
        rig.processor.run()
    assert raised.value.exit_code == 1
    assert rig.consumer.callback_errors == []
    assert rig.consumer.closed


def test_a_failing_subscribe_stops_in_one_line() -> None:
    rig = Rig()
    rig.consumer.fail("subscribe", KafkaError(KafkaError._INVALID_ARG, "bad topic list"))
    with pytest.raises(FatalKafkaError, match="bad topic list"):
        rig.processor.run()
    assert rig.consumer.closed


def test_an_error_leaving_the_group_at_close_is_no_failure() -> None:
    rig = assigned_rig()
    publish_windows(rig, range(2))
    rig.turns(2)
    rig.consumer.fail("close", KafkaError._TIMED_OUT)
    rig.processor.request_stop()
    rig.processor.run()
    assert rig.consumer.closed


@pytest.mark.parametrize("seed", range(6))
def test_random_client_errors_and_rebalances_never_change_the_output(seed: int) -> None:
    """At every turn, maybe an error (any code a rebalance or a failover answers) at a
    random call, maybe a partition revoked or lost and given back (with a partition away
    for longer, the other one's watermark would make its rows late: another test's
    subject): the output is the reference."""
    rng = random.Random(seed)
    calls = ["seek", "committed", "assignment", "position", "get_watermark_offsets",
             "consume", "pause", "resume", "begin_transaction",
             "send_offsets_to_transaction", "commit_transaction", "abort_transaction"]
    codes = [*ASSIGNMENT_CHANGED, *COORDINATOR_MOVING, KafkaError.ILLEGAL_GENERATION,
             KafkaError.REBALANCE_IN_PROGRESS]
    abortable = {KafkaError.ILLEGAL_GENERATION, KafkaError.REBALANCE_IN_PROGRESS}
    rig = assigned_rig(sink="transactional", input={"max_groups": 60, "over_budget": "pause"})
    for window in range(16):
        rig.publish(rng.randrange(2), batch(window * SIZE_MS + rng.randrange(SIZE_MS)))
        for call in rng.sample(calls, 2):
            code = rng.choice(codes)
            rig.consumer.fail(call, KafkaError(code, txn_requires_abort=code in abortable))
        if rng.random() < 0.4:
            partition = rng.choice([P0, P1])
            rig.consumer.rebalance(rng.choice(["revoke", "lost"]), [partition])
            rig.consumer.rebalance("assign", [partition])
        rig.turns(2)
    closed_output_is_exact(rig, before_ms=16 * SIZE_MS)
    assert rig.consumer.callback_errors == []
    assert len({call for call, _code in rig.consumer.failures.raised}) >= 5


def test_a_stop_while_a_rewind_is_pending_commits_nothing_and_the_next_owner_loses_nothing(
) -> None:
    """A partition is revoked, and the rewind that rebuilds the state of the ones kept
    cannot read the commits yet; then the daemon is told to stop. Its open windows still
    hold rows of the revoked partition, which its new owner reads again: the stop's last
    flush must not emit them (the rebalance storm's double count), and whatever owns the
    partitions next emits every window once."""
    rig = assigned_rig()
    rig.publish(1, batch(2 * SIZE_MS + 100))  # p1 holds window 2 open...
    for window in range(6):  # ...while p0 runs ahead of it
        rig.publish(0, batch(window * SIZE_MS + 100))
    rig.turns(3)
    output_before = len(rig.broker.output(SINK))
    committed_before = (rig.committed(P0), rig.committed(P1))
    rig.consumer.fail("committed", KafkaError._TIMED_OUT, times=1_000)
    rig.consumer.rebalance("revoke", [P1])
    rig.turns(2)
    assert ("committed", KafkaError._TIMED_OUT) in rig.consumer.failures.raised
    rig.processor.request_stop()
    rig.processor.run()
    assert len(rig.broker.output(SINK)) == output_before
    assert (rig.committed(P0), rig.committed(P1)) == committed_before

    # The next owner of both partitions, from what the group committed.
    successor = Rig(broker=rig.broker)
    successor.published = rig.published
    successor.consumer.rebalance("assign", [P0, P1])
    closed_output_is_exact(successor, before_ms=6 * SIZE_MS)
