"""The run loop against an in-memory broker: rebalances, aborts, fencing, rejections and
the memory budget's pauses, each step checked as it happens (the same paths run against
a real broker in tests/integration)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
import yaml
from confluent_kafka import KafkaError, Message, TopicPartition
from polars.testing import assert_frame_equal

from consumer import cli
from consumer.kafka.errors import FatalKafkaError
from consumer.kafka.sink import AbortRequiredError
from tests.consumer.kafka.rig import (
    P0,
    P1,
    SINK,
    SIZE_MS,
    SOURCE,
    Rig,
    batch,
    config,
    reference,
    sorted_output,
)
from wire.errors import EXIT_FAILED
from wire.output import decode_output


@pytest.fixture
def rig() -> Rig:
    rig = Rig()
    rig.consumer.rebalance("assign", [P0, P1])
    return rig


def two_windows_out_third_open(rig: Rig) -> None:
    """Both partitions: offsets 0-1 in window 0, 2 in window 1, 3 in window 2 (open)."""
    for partition in (0, 1):
        for ts in (100, 200, 1_100, 2_100):
            rig.publish(partition, batch(ts))
    rig.turns()
    assert sorted(rig.output()["window_start"].unique()) == [0, 1_000]
    assert rig.committed(P0) == rig.committed(P1) == 3


def test_a_revoke_commits_the_committable_part_before_the_partition_goes(rig: Rig) -> None:
    two_windows_out_third_open(rig)
    rig.publish(0, batch(3_100))  # p0 moves on; p1 holds the watermark at 2100
    rig.turns(2)
    before = len(rig.broker.transactions)
    rig.consumer.rebalance("revoke", [P1])
    rig.processor.run_once()  # the revoke is served inside this poll
    revoke_commits = rig.broker.transactions[before:]
    assert len(revoke_commits) == 1, "one forced commit, inside the revoke callback"
    _records, offsets = revoke_commits[0]
    assert {(tp.topic, tp.partition): tp.offset for tp in offsets} == {P0: 3, P1: 3}
    # Then the state of what we keep is rebuilt from its commit: p0 replays from 3.
    assert rig.consumer.seeks == [(P0, 3)]
    assert rig.pipeline.open_windows() == 0
    rig.turns()
    # p0 alone now sets the watermark (3100): its window 2 closes, window 3 stays open.
    assert rig.pipeline.open_windows() == 1
    assert sorted(rig.output()["window_start"].unique()) == [0, 1_000, 2_000]


def test_a_lost_assignment_discards_state_and_seeks_back_without_committing(rig: Rig) -> None:
    two_windows_out_third_open(rig)
    rig.publish(0, batch(2_500))
    rig.turns(2)
    assert rig.pipeline.open_windows() == 1
    before = len(rig.broker.transactions)
    rig.consumer.rebalance("lost", [P1])
    rig.processor.run_once()
    assert len(rig.broker.transactions) == before, "a lost partition is not ours to commit"
    assert rig.consumer.seeks == [(P0, 3)]
    assert rig.pipeline.open_windows() == 0
    rig.turns(2)
    assert rig.pipeline.counters.rows == 3 * (8 + 1 + 2)  # both first runs, then the replay


def test_an_aborted_transaction_rewinds_every_partition_and_loses_nothing(rig: Rig) -> None:
    for partition in (0, 1):
        for ts in (100, 600, 1_100, 2_100):
            rig.publish(partition, batch(ts, value=partition + ts / 1000))
    rig.fake_sink.failures.append(AbortRequiredError("the broker aborted the transaction"))
    rig.turns(1)
    assert rig.broker.transactions == []
    assert rig.processor.counters.aborts == 1
    rig.turns(1)
    assert sorted(rig.consumer.seeks) == [(P0, 0), (P1, 0)]  # nothing committed yet
    rig.turns(3)
    for partition in (0, 1):  # the last window closes once both partitions are past it
        rig.publish(partition, batch(3_500))
    rig.turns(3)
    expected = reference(rig.published).filter(pl.col("window_start") < 3_000)
    assert_frame_equal(sorted_output(rig), expected, check_dtypes=False)


def test_a_fenced_producer_stops_the_loop_with_exit_code_1(rig: Rig) -> None:
    rig.publish(0, batch(100))
    rig.fake_sink.failures.append(FatalKafkaError("Fenced: a newer instance took over"))
    with pytest.raises(FatalKafkaError) as raised:
        rig.processor.run()
    assert raised.value.exit_code == EXIT_FAILED == 1
    assert rig.consumer.closed
    assert rig.fake_sink.closed


def test_fenced_during_a_revoke_stops_the_loop_but_not_inside_the_callback(rig: Rig) -> None:
    two_windows_out_third_open(rig)
    rig.fake_sink.failures.append(FatalKafkaError("Fenced: a newer instance took over"))
    rig.consumer.rebalance("revoke", [P1])  # the revoke's commit is the one fenced
    with pytest.raises(FatalKafkaError):
        rig.processor.run()
    assert rig.consumer.callback_errors == []
    assert rig.consumer.closed
    assert rig.fake_sink.closed


def test_a_fenced_static_member_stops_the_loop(rig: Rig) -> None:
    # How librdkafka reports "Static consumer fenced by other consumer with same
    # group.instance.id": an error event of code _FATAL, whose fatal() is False.
    fenced = KafkaError(KafkaError._FATAL, "Fatal error: Broker: Static consumer fenced")
    assert not fenced.fatal()
    rig.broker.topics[SOURCE][0].append(Message(error=fenced))
    with pytest.raises(FatalKafkaError, match="Static consumer fenced"):
        rig.processor.run()
    assert rig.consumer.closed


def test_a_fatal_error_event_in_a_poll_that_a_rewind_drops_still_stops_the_loop(
    rig: Rig,
) -> None:
    # Seen in CI after broker restarts: the session timed out, the assignment was lost
    # and the rejoin answered "Static consumer fenced". The fatal event came in the same
    # poll as messages a rewind drops; dropped with them, it left the daemon alive,
    # consuming nothing and never exiting. librdkafka delivers such an event once.
    two_windows_out_third_open(rig)
    rig.publish(0, batch(3_100))  # a message in the same poll, dropped by the rewind
    rig.consumer.rebalance("revoke", [P1])  # its partitions go: a rewind is due
    rig.consumer.error_events.append(
        KafkaError(KafkaError._FATAL, "Fatal error: Broker: Static consumer fenced"))
    with pytest.raises(FatalKafkaError, match="Static consumer fenced"):
        run_turns(rig, 3)  # a few turns, not run(): without the fix it never ends


def run_turns(rig: Rig, turns: int) -> None:
    for _turn in range(turns):
        rig.processor.run_once()


def test_the_command_line_exits_1_with_one_line_when_fenced(
    rig: Rig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rig.publish(0, batch(100))
    rig.fake_sink.failures.append(FatalKafkaError("Fenced: a newer instance took over"))
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config(service={"http_port": None})))
    monkeypatch.setattr("consumer.compose.build_processor", lambda *_a, **_k: rig.processor)
    monkeypatch.setattr(cli, "check_topics", lambda *_a, **_k: None)
    assert cli.main(["run", "--config", str(path)]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1] == ("consumer: stopping on a fatal Kafka error: "
                         "Fenced: a newer instance took over")
    assert not any("Traceback" in line for line in lines)


@pytest.mark.parametrize("dlq", [None, "dlq"])
def test_rejections_before_the_first_valid_message_are_committed(dlq: str | None) -> None:
    rig = Rig(output={"dlq_topic": dlq} if dlq else {})
    rig.broker.create_topic("dlq")
    rig.consumer.rebalance("assign", [P0, P1])
    for value in (b"not arrow", b"", b"\xff" * 16):
        rig.broker.produce(SOURCE, 0, value)
    rig.turns(15)  # past the commit interval
    assert rig.committed(P0) == 3
    assert len(rig.broker.output("dlq")) == (3 if dlq else 0)
    assert rig.processor.counters.rejected == 3
    # Committed with the position reached, so a restart does not dead-letter them again.
    metadata = rig.broker.committed[P0].metadata
    assert metadata is not None
    assert '"position":3' in metadata


def test_messages_of_a_paused_partition_delivered_late_are_held_back_and_read_again() -> None:
    # p0 runs ahead, p1 holds the watermark at window 0: p0 is paused at 80% of 30
    # groups (8 windows of 3 sites), one message a poll.
    rig = Rig(input={"max_groups": 30, "over_budget": "pause"},
              processing={"poll_max_messages": 1})
    rig.consumer.rebalance("assign", [P0, P1])
    rig.publish(1, batch(100))
    for window in range(12):
        rig.publish(0, batch(window * SIZE_MS + 500))
    rig.turns(8)
    assert rig.consumer.paused == {P0}
    groups = rig.pipeline.groups()
    assert groups == 24
    rig.consumer.leak_paused = True  # librdkafka had one more of p0's messages queued
    held_at = rig.consumer.positions[P0]
    rig.turns(1)
    rig.consumer.leak_paused = False
    assert rig.pipeline.groups() == groups, "the leaked message was not aggregated"
    assert rig.consumer.seeks[-1] == (P0, held_at), "and will be read again"
    rig.publish(1, batch(9_000))  # the laggard catches up: windows close, p0 resumes
    rig.turns(40)
    for partition in (0, 1):
        rig.publish(partition, batch(20_000))
    rig.turns(10)
    expected = reference(rig.published).filter(pl.col("window_start") < 20_000)
    assert_frame_equal(sorted_output(rig), expected, check_dtypes=False)
    assert all(decode_output(r.value, r.headers).final for r in rig.broker.output(SINK))


def test_the_topic_partition_offsets_carry_commit_metadata(rig: Rig) -> None:
    two_windows_out_third_open(rig)
    stored = rig.broker.committed[P0]
    assert isinstance(stored, TopicPartition)
    assert stored.metadata is not None
    assert '"frontier":2100' in stored.metadata  # emitted through the watermark
