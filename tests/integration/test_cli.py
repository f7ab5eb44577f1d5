"""`python -m consumer` against Apache Kafka: tail (tables, JSON, dead letters, the wrong
topic), topics create, check, and the start-up check of the topics' message size."""

from __future__ import annotations

import json
import logging
import random
import uuid
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._resource import ResourceType
from confluent_kafka.cimpl import NewTopic
from polars.testing import assert_frame_equal

from consumer.cli import main
from consumer.config import Settings
from consumer.core.late import late_records
from consumer.core.types import MESSAGE_INDEX, MessageRef
from consumer.kafka.tail import read_output
from tests.conftest import TopicFactory
from tests.integration.conftest import (
    daemon_settings,
    publish_tables,
    running_daemon,
    wait_all_committed,
)
from tests.integration.data import KEYS, T0, sensor_table
from tests.wire.helpers import closed_pipe_run
from wire.errors import EXIT_PIPE_CLOSED
from wire.output import OutputFormat, encode_window

pytestmark = pytest.mark.integration

POISON = [b"not arrow at all", b"\xff" * 32]


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    """main() configures logging for the process; give later tests theirs back."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(autouse=True)
def _no_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)


@dataclass(frozen=True)
class Ran:
    """Topics a daemon has run over: windows on ``output``, dead letters on ``dlq``."""

    bootstrap: str
    settings: Settings
    source: str
    output: str
    dlq: str
    poison_offsets: list[int]


def _create(admin: AdminClient, *names: str) -> None:
    futures = admin.create_topics([NewTopic(n, num_partitions=1, replication_factor=1)
                                   for n in names], operation_timeout=30)
    for future in futures.values():
        future.result(timeout=30)


@pytest.fixture(scope="module")
def ran(bootstrap: str, admin: AdminClient) -> Iterator[Ran]:
    """One daemon run, shared by the tail tests: 12 good batches, then two poison ones."""
    suffix = uuid.uuid4().hex[:10]
    source, output, dlq = f"in-{suffix}", f"out-{suffix}", f"dlq-{suffix}"
    _create(admin, source, output, dlq)
    settings = daemon_settings(
        bootstrap, source, output, output={"dlq_topic": dlq},
        window={"kind": "tumbling", "time": "event", "timestamp_column": "ts",
                "size_ms": 1000, "idle_timeout_ms": 1000})
    rng = random.Random(11)
    good = [(0, sensor_table(rng, 40, T0 + i * 250, 250)) for i in range(12)]
    with running_daemon(settings) as daemon:
        publish_tables(bootstrap, source, good)
        producer = Producer({"bootstrap.servers": bootstrap})
        for value in POISON:
            producer.produce(source, value, partition=0)
        assert producer.flush(10) == 0
        wait_all_committed(daemon, settings, rows=12 * 40)
    try:
        yield Ran(bootstrap, settings, source, output, dlq, [12, 13])
    finally:
        with suppress(Exception):
            for future in admin.delete_topics([source, output, dlq]).values():
                future.result(timeout=10)


def tail(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["tail", "--from-beginning", "--idle-timeout-s", "2", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- tail ---------------------------------------------------------------------------------


def test_tail_json_is_one_object_per_window_for_jq(
    ran: Ran, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = tail(capsys, "--topic", ran.output, "--bootstrap-servers", ran.bootstrap,
                          "--format", "json")
    assert (code, err) == (0, "")
    documents = [json.loads(line) for line in out.splitlines()]
    windows = list(read_output(ran.bootstrap, ran.output, idle_timeout_s=2))
    assert len(documents) == len(windows) == 3
    for document, window in zip(documents, windows, strict=True):
        assert document["final"] is True
        assert document["input_rows"] == window.window_rows
        start = window.frame["window_start"].dt.strftime("%Y-%m-%dT%H:%M:%S%.3fZ")[0]
        assert document["window_start"] == start
        columns = [*KEYS, "reading_sum", "reading_count", "row_count"]
        assert_frame_equal(pl.DataFrame(document["rows"]).select(columns),
                           window.frame.select(columns), check_dtypes=False)


def test_tail_prints_a_table_per_window(ran: Ran, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = tail(capsys, "--topic", ran.output, "--bootstrap-servers", ran.bootstrap)
    assert code == 0
    heads = [line for line in out.splitlines() if line.startswith("window [")]
    assert len(heads) == 3
    assert heads[0].startswith("window [2026-01-01T00:00:00.000Z, 2026-01-01T00:00:01.000Z): ")
    assert heads[0].endswith("input rows, final")


@pytest.mark.parametrize("argv", [
    ["--topic", "OUTPUT", "--format", "json"],
    ["--topic", "OUTPUT"],
    ["--dlq", "DLQ"],
])
def test_tail_into_a_closed_pipe_ends_quietly_as_cat_does(ran: Ran, argv: list[str]) -> None:
    """``tail ... | head -1``: the reader is gone before the first window is printed."""
    topics = {"OUTPUT": ran.output, "DLQ": ran.dlq}
    done = closed_pipe_run("consumer", "tail", "--from-beginning", "--idle-timeout-s", "5",
                           "--bootstrap-servers", ran.bootstrap,
                           *(topics.get(arg, arg) for arg in argv))
    assert (done.returncode, done.stderr.decode()) == (EXIT_PIPE_CLOSED, "")


def test_tail_dlq_shows_each_rejected_message_with_its_origin_and_reason(
    ran: Ran, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = tail(capsys, "--dlq", ran.dlq, "--bootstrap-servers", ran.bootstrap,
                          "--format", "json")
    assert (code, err) == (0, "")
    letters = [json.loads(line) for line in out.splitlines()]
    assert [d["origin"] for d in letters] == [f"{ran.source}[0]@{o}" for o in ran.poison_offsets]
    assert [d["reason"] for d in letters] == ["not-arrow-ipc", "invalid-ipc"]
    assert [d["value_bytes"] for d in letters] == [len(v) for v in POISON]
    for letter in letters:
        assert letter["message"]
        assert not letter["message"].startswith(letter["reason"])
        assert letter["consumer_group"] == ran.settings.kafka.group_id
        assert letter["dead_letter"].startswith(f"{ran.dlq}[0]@")
    code, out, _ = tail(capsys, "--dlq", ran.dlq, "--bootstrap-servers", ran.bootstrap)
    lines = out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"{ran.source}[0]@12 (")
    assert f"): not-arrow-ipc: {letters[0]['message']} [16 bytes, group " in lines[0]


def test_tail_takes_topics_broker_and_security_from_the_config(
    ran: Ran, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(ran.settings.model_dump(mode="json", exclude={
        "kafka": {"security"}})))
    code, out, _ = tail(capsys, "--config", str(config), "--format", "json")
    assert code == 0
    assert len(out.splitlines()) == 3
    code, out, _ = tail(capsys, "--config", str(config), "--dlq", "--format", "json")
    assert code == 0
    assert len(out.splitlines()) == 2


def test_tail_on_the_input_topic_names_the_message_and_what_it_is(
    ran: Ran, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = tail(capsys, "--topic", ran.source, "--bootstrap-servers", ran.bootstrap)
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        (f"consumer: {ran.source}[0]@0 is not arrowagg output (no arrowagg.window-start "
        "header); it is arrowagg input: tail the output topic (output.topic)")]
    code, _, err = tail(capsys, "--dlq", ran.output, "--bootstrap-servers", ran.bootstrap)
    assert code == 2
    assert err.startswith(f"consumer: {ran.output}[0]@0 is not a dead letter (no "
                          "arrowagg.dlq.error-class header)")


def test_tail_skips_a_stray_message_after_the_first_window_with_a_warning(
    bootstrap: str, topic_factory: TopicFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = topic_factory("out")
    frame = pl.DataFrame({"site": ["a"], "v": [1.0], "row_count": [1]})
    producer = Producer({"bootstrap.servers": bootstrap})
    formats: tuple[tuple[int, OutputFormat], ...] = ((0, "json"), (1000, "arrow"))
    first, second = (encode_window(frame, start_ms=start, end_ms=start + 1000, input_rows=1,
                                   fmt=fmt, compression="none", max_bytes=10_000)[0]
                     for start, fmt in formats)
    messages: list[tuple[bytes, list[tuple[str, str | bytes | None]]]] = [
        (first.value, list(first.headers)), (b"stray", []),
        (second.value, list(second.headers))]
    for value, headers in messages:
        producer.produce(topic, value, headers=headers)
    assert producer.flush(10) == 0
    code, out, err = tail(capsys, "--topic", topic, "--bootstrap-servers", bootstrap,
                          "--format", "json")
    assert code == 0
    assert [json.loads(line)["window_start"] for line in out.splitlines()] == [
        "1970-01-01T00:00:00.000Z", "1970-01-01T00:00:01.000Z"]
    assert err.splitlines() == [(f"consumer: skipped {topic}[0]@1 is not arrowagg output (no "
                                "arrowagg.window-start header)")]


def test_tail_late_shows_the_rows_their_origin_and_the_window_they_missed(
    bootstrap: str, topic_factory: TopicFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = topic_factory("late")
    rows = pl.DataFrame({
        "site": ["a", "b"], "ts": [T0 + 100, T0 + 200], "reading": [1.5, 2.5],
        "window_start": [T0, T0], "window_end": [T0 + 1000, T0 + 1000], MESSAGE_INDEX: [0, 0],
    }).with_columns(pl.col("ts").cast(pl.Datetime("ms", "UTC")))
    [record] = late_records(rows, [MessageRef(("sensors", 3), 17, 2)], topic=topic,
                            compression="zstd", max_bytes=100_000)
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, record.value, key=record.key, headers=list(record.headers))
    assert producer.flush(10) == 0
    code, out, err = tail(capsys, "--late", topic, "--bootstrap-servers", bootstrap,
                          "--format", "json")
    assert (code, err) == (0, "")
    [document] = [json.loads(line) for line in out.splitlines()]
    assert {k: v for k, v in document.items() if k != "late_record"} == {
        "kind": "rows", "origin": "sensors[3]@17", "window_start": "2026-01-01T00:00:00.000Z",
        "window_end": "2026-01-01T00:00:01.000Z", "chunk": [1, 1],
        "rows": [{"site": "a", "ts": "2026-01-01T00:00:00.100Z", "reading": 1.5,
                  "window_start": "2026-01-01T00:00:00.000Z",
                  "window_end": "2026-01-01T00:00:01.000Z"},
                 {"site": "b", "ts": "2026-01-01T00:00:00.200Z", "reading": 2.5,
                  "window_start": "2026-01-01T00:00:00.000Z",
                  "window_end": "2026-01-01T00:00:01.000Z"}]}
    code, out, _ = tail(capsys, "--late", topic, "--bootstrap-servers", bootstrap)
    assert code == 0
    assert out.splitlines()[0] == (
        "late rows from sensors[3]@17 for window [2026-01-01T00:00:00.000Z, "
        "2026-01-01T00:00:01.000Z), emitted before they came: 2 rows, not aggregated")
    code, out, err = tail(capsys, "--topic", topic, "--bootstrap-servers", bootstrap)
    assert (code, out) == (2, "")
    assert err.splitlines() == [(f"consumer: {topic}[0]@0 is not arrowagg output; it is a late "
                                "record: use tail --late")]


def test_tail_on_a_missing_topic_is_one_line_at_once(
    bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    code, out, err = tail(capsys, "--topic", missing, "--bootstrap-servers", bootstrap)
    assert (code, out) == (1, "")
    assert err.splitlines() == [(f"consumer: topic {missing} does not exist on {bootstrap}; "
                                "check the topic name")]


# -- topics create ------------------------------------------------------------------------


def config_file(tmp_path: Path, bootstrap: str, **topics: str) -> tuple[Path, dict[str, str]]:
    suffix = uuid.uuid4().hex[:10]
    names = {"input": f"in-{suffix}", "output": f"out-{suffix}", "late": f"late-{suffix}",
             "dlq": f"dlq-{suffix}", **topics}
    document = {
        "kafka": {"bootstrap_servers": bootstrap},
        "input": {"topics": [names["input"]], "max_message_bytes": 2_000_000},
        "output": {"topic": names["output"], "late_topic": names["late"],
                   "dlq_topic": names["dlq"], "max_message_bytes": 500_000},
        "window": {"size_ms": 1000, "timestamp_column": "ts"},
        "processing": {"instance_id": "agg-1"},
        "service": {"http_port": 0},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(document))
    return path, names


def topic_config(admin: AdminClient, topic: str) -> tuple[int, int]:
    """(partitions, max.message.bytes)"""
    partitions = len(admin.list_topics(timeout=10).topics[topic].partitions)
    [future] = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
    return partitions, int(future.result(timeout=10)["max.message.bytes"].value)


def test_topics_create_sizes_each_topic_for_the_configuration_and_leaves_others_alone(
    bootstrap: str, admin: AdminClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, names = config_file(tmp_path, bootstrap)
    try:
        assert main(["topics", "create", "--config", str(config)]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out == [
            (f"created {names['input']} (input): 3 partitions, replication factor 1, "
            "max.message.bytes 2004096"),
            (f"created {names['output']} (output): 1 partition, replication factor 1, "
            "max.message.bytes 504096"),
            (f"created {names['late']} (late): 1 partition, replication factor 1, "
            "max.message.bytes 504096"),
            (f"created {names['dlq']} (dlq): 1 partition, replication factor 1, "
            "max.message.bytes 2004096")]
        assert topic_config(admin, names["input"]) == (3, 2_004_096)
        assert topic_config(admin, names["output"]) == (1, 504_096)
        assert topic_config(admin, names["dlq"]) == (1, 2_004_096)
        assert main(["topics", "create", "--config", str(config), "--partitions", "6"]) == 0
        again = capsys.readouterr().out.splitlines()
        assert again == [line.replace("created", "exists", 1) + "; left alone" for line in out]
        assert main(["check", "--config", str(config)]) == 0
        checked = capsys.readouterr().out
        assert f"\n  {names['input']}: 3 partitions, replication factor 1, " in checked
        assert checked.endswith("\nok: the daemon can start with this configuration\n")
    finally:
        admin.delete_topics(list(names.values()))


def test_topics_create_dry_run_creates_nothing(
    bootstrap: str, admin: AdminClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, names = config_file(tmp_path, bootstrap)
    assert main(["topics", "create", "--config", str(config), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(" (")[0] for line in out] == [
        f"would create {names[role]}" for role in ("input", "output", "late", "dlq")]
    assert not set(names.values()) & set(admin.list_topics(timeout=10).topics)


def test_topics_create_asks_no_more_replicas_than_brokers(
    bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, _ = config_file(tmp_path, bootstrap)
    assert main(["topics", "create", "--config", str(config), "--replication-factor", "3"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        (f"consumer: replication factor 3 needs 3 brokers, and {bootstrap} has 1; lower "
        "--replication-factor")]


def test_an_output_topic_too_small_for_the_output_stops_create_check_and_run(
    bootstrap: str, admin: AdminClient, topic_factory: TopicFactory, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    small = topic_factory("small-out", config={"max.message.bytes": "100000"})
    config, names = config_file(tmp_path, bootstrap, output=small)
    expected = (f"consumer: topic {small} takes messages of at most 100000 bytes "
                "(max.message.bytes), but output.max_message_bytes needs 504096: raise it "
                f"(kafka-configs.sh --alter --entity-type topics --entity-name {small} "
                "--add-config max.message.bytes=504096) or lower output.max_message_bytes")
    try:
        assert main(["topics", "create", "--config", str(config)]) == 1
        captured = capsys.readouterr()
        assert (f"exists {small} (output): 1 partition, replication factor 1, "
                "max.message.bytes 100000; left alone") in captured.out.splitlines()
        assert captured.err.splitlines() == [expected]
        assert main(["check", "--config", str(config)]) == 1
        assert capsys.readouterr().err.splitlines() == [expected]
        assert main(["run", "--config", str(config)]) == 1
        said = [line for line in capsys.readouterr().err.splitlines()
                if line.startswith("consumer: ")]  # after the daemon's log lines
        assert said == [expected]
    finally:
        admin.delete_topics([n for n in names.values() if n != small])


def test_missing_topics_name_the_create_command_for_the_config_given(
    bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, names = config_file(tmp_path, bootstrap)
    missing = ", ".join(names[k] for k in ("input", "output", "late", "dlq"))
    for command in ("check", "run"):
        assert main([command, "--config", str(path)]) == 1
        assert capsys.readouterr().err.splitlines()[-1] == (
            f"consumer: topic(s) {missing} do not exist on {bootstrap}; create them: "
            f"python -m consumer topics create --config {path}")
