"""`python -m consumer` as a user meets it: help, bad config, explain."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from consumer.cli import main
from tests.conftest import REPO


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    """main() configures logging for the process; give later tests theirs back."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def seed_like_file(path: Path) -> Path:
    """The seed's schema: strings, a timestamp, *_sum/_count/_min/_max, other numerics."""
    table = pa.table({
        "host": pa.array(["a"], pa.string()),
        "region name": pa.array(["eu"], pa.large_string()),
        "ts": pa.array([0], pa.timestamp("ns")),
        "bytes_sum": pa.array([1], pa.int64()),
        "req_count": pa.array([1], pa.int32()),
        "lat_min": pa.array([1.0], pa.float32()),
        "lat_max": pa.array([1.0], pa.float64()),
        "cpu": pa.array([1.0], pa.float64()),
        "flag": pa.array([True]),
    })
    with pa.ipc.new_stream(path, table.schema) as writer:
        writer.write_table(table)
    return path


def test_help_explains_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    commands = ("run", "check", "topics", "explain", "tail")
    for command in commands:
        assert command in text
    for argv in ([command, "--help"] for command in commands):
        assert main(argv) == 0
        assert "--" in capsys.readouterr().out
    assert main(["topics", "create", "--help"]) == 0
    assert "--replication-factor" in capsys.readouterr().out


def test_bad_config_is_one_line_naming_the_key_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text((REPO / "config.yaml").read_text().replace("size_ms:", "sizee_ms:"))
    assert main(["run", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert any("window.sizee_ms: unknown key" in line for line in err)
    assert all(line.startswith("consumer: ") for line in err)
    assert "Traceback" not in "\n".join(err)


def test_missing_config_file_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read the config file" in capsys.readouterr().err


def test_explain_shows_the_seed_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.yaml"
    example = (REPO / "config.yaml").read_text().replace(
        "timestamp_column: ts", "timestamp_column: none_here").replace(
        "time: event ", "time: processing ").splitlines()
    config.write_text("\n".join(line for line in example if not line.lstrip().startswith(
        ("allowed_lateness_ms:", "idle_timeout_ms:"))))  # event-time keys
    sample = seed_like_file(tmp_path / "sample.arrows")
    assert main(["explain", "--config", str(config), "--sample", str(sample)]) == 0
    out = capsys.readouterr().out
    lines = {line.strip().split(":")[0].strip("'"): line for line in out.splitlines()}
    for key in ("host", "region name", "ts"):
        assert "key" in lines[key]
    assert "sum" in lines["bytes_sum"]
    assert "sum" in lines["req_count"]
    assert "min" in lines["lat_min"]
    assert "max" in lines["lat_max"]
    assert "sum" in lines["cpu"]
    assert "flag" in out
    assert "bool" in lines["flag"]


def test_explain_with_event_time_makes_ts_the_window(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sample = seed_like_file(tmp_path / "sample.arrows")
    assert main(["explain", "--config", str(REPO / "config.yaml"), "--sample", str(sample)]) == 0
    out = capsys.readouterr().out
    assert "time column: 'ts'" in out


def test_explain_takes_the_pinned_schema_and_says_where_each_schema_came_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sample = seed_like_file(tmp_path / "sample.arrows")
    monkeypatch.setenv("ARROWAGG_AGGREGATION__SCHEMA_FROM", str(sample))
    assert main(["explain", "--config", str(REPO / "config.yaml")]) == 0
    out = capsys.readouterr().out
    assert f"\nschema: from aggregation.schema_from ({sample})\ntime column: 'ts'" in out
    assert main(["explain", "--config", str(REPO / "config.yaml"), "--sample", str(sample)]) == 0
    assert f"\nschema: from --sample {sample}\n" in capsys.readouterr().out


def test_explain_rejects_an_unreadable_sample(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.arrows"
    bad.write_bytes(b"not arrow at all")
    assert main(["explain", "--config", str(REPO / "config.yaml"), "--sample", str(bad)]) == 2
    assert "cannot read it" in capsys.readouterr().err


# -- check --------------------------------------------------------------------------------


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("ARROWAGG_") or name == "KAFKA_BOOTSTRAP_SERVERS":
            monkeypatch.delenv(name)


def example(tmp_path: Path, *replacements: tuple[str, str]) -> Path:
    text = (REPO / "config.yaml").read_text()
    for old, new in replacements:
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


@pytest.mark.usefixtures("clean_environment")
def test_check_shows_the_effective_config_with_env_marked_and_secrets_masked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "s3cret-never-printed"  # noqa: S105 - a test value that must not leak
    config = example(tmp_path, ("consumer: {}", "consumer: {ssl.key.password: " + secret + "}"))
    monkeypatch.setenv("ARROWAGG_KAFKA__GROUP_ID", "from-env")
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "broker-9:9092")
    monkeypatch.setenv("ARROWAGG_KAFKA__SECURITY__SSL_KEY_PASSWORD", secret)
    assert main(["check", "--config", str(config), "--offline"]) == 0
    out = capsys.readouterr().out
    assert secret not in out
    lines = out.splitlines()
    assert "  bootstrap_servers: broker-9:9092  # from KAFKA_BOOTSTRAP_SERVERS" in lines
    assert "  group_id: from-env  # from ARROWAGG_KAFKA__GROUP_ID" in lines
    assert ("    ssl_key_password: '**********'  # from "
            "ARROWAGG_KAFKA__SECURITY__SSL_KEY_PASSWORD") in lines
    assert "    ssl.key.password: '**********'" in lines
    assert "  client_id: arrowagg" in lines  # from the file: no mark
    assert "  liveness_timeout_s: 60.0  # default" in lines
    words = " ".join(out.split("windows:\n", 1)[1].split("\n\n", 1)[0].split())
    assert words.startswith("tumbling windows of 5 s, by event time from column 'ts' (a "
                            "timestamp, or an integer read as epoch milliseconds)")
    assert "less allowed_lateness_ms (1 s)" in words
    assert "late: sent to sensors-late" in words
    assert "processing.instance_id is not set" in out
    assert lines[-1] == "the broker was not asked (--offline)"


def warnings_of(out: str) -> list[str]:
    text = out.split("\nwarnings:\n", 1)[1].split("\n\n", 1)[0]
    return [" ".join(w.split()) for w in text.split("  - ")[1:]]


@pytest.mark.usefixtures("clean_environment")
def test_check_warns_of_what_surprises_operators(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = example(tmp_path, ("allowed_lateness_ms: 1000", "allowed_lateness_ms: 0"),
                     ("idle_timeout_ms: 5000", "idle_timeout_ms: 2000"),
                     ("late_topic: sensors-late", "late_topic: null"),
                     ("instance_id: null", "instance_id: agg-1"),
                     ("producer: {}", "producer: {enable.idempotence: false}"))
    assert main(["check", "--config", str(config), "--offline"]) == 0
    found = warnings_of(capsys.readouterr().out)
    assert [w.split(":")[0].split(" (")[0] for w in found] == [
        "aggregation.schema_from is not set",
        "window.allowed_lateness_ms is 0", "window.idle_timeout_ms",
        "output.late_topic is not set", ("kafka.producer.enable.idempotence overrides a "
        "setting exactly-once depends on")]


@pytest.mark.usefixtures("clean_environment")
def test_check_describes_count_windows_and_their_unused_timestamp_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = example(tmp_path, ("kind: tumbling", "kind: count"),
                     ("time: event ", "# time: event "), ("size_ms: 5000", "# size_ms: 5000"),
                     ("allowed_lateness_ms: 1000", "# allowed_lateness_ms: 1000"),
                     ("# count_rows: 1000000", "count_rows: 1000000"))
    assert main(["check", "--config", str(config), "--offline"]) == 0
    out = capsys.readouterr().out
    words = " ".join(out.split("windows:\n", 1)[1].split("\n\n", 1)[0].split())
    assert words.startswith("count windows: a window closes after 1000000 rows")
    assert "window_start and window_end are processing times" in words
    assert ("window.timestamp_column 'ts' is not used by count windows: the column is "
            "skipped, not a key") in " ".join(out.split())


@pytest.mark.usefixtures("clean_environment")
def test_an_empty_group_id_stops_check_and_run_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = example(tmp_path, ("group_id: arrowagg", 'group_id: ""'))
    for command in ("check", "run"):
        assert main([command, "--config", str(config)]) == 2
        assert capsys.readouterr().err.splitlines() == [
            f"consumer: bad configuration: {config}: kafka.group_id: must not be empty"]


@pytest.mark.usefixtures("clean_environment")
def test_an_unknown_librdkafka_key_stops_run_in_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = example(tmp_path, ("consumer: {}", "consumer: {fetch.wait.max.mss: 10}"))
    assert main(["run", "--config", str(config)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        (f"consumer: bad configuration: {config}: kafka.consumer.fetch.wait.max.mss: librdkafka "
        "has no such property (check its spelling)")]


def test_explain_says_an_integer_time_column_is_epoch_milliseconds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sample = tmp_path / "int.arrows"
    table = pa.table({"ts": pa.array([0], pa.int64()), "site": ["a"], "v": [1.0]})
    with pa.ipc.new_stream(sample, table.schema) as writer:
        writer.write_table(table)
    assert main(["explain", "--config", str(REPO / "config.yaml"), "--sample", str(sample)]) == 0
    assert (
        "time column: 'ts' (int64, read as epoch milliseconds; assigns windows; never a key)"
    ) in capsys.readouterr().out.splitlines()


def test_explain_shows_the_windows_and_which_aggregates_buffer_and_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sample = tmp_path / "latency.arrows"
    table = pa.table({"ts": pa.array([0], pa.timestamp("ms", "UTC")), "site": ["a"],
                      "latency": [1.0], "bytes": [5]})
    with pa.ipc.new_stream(sample, table.schema) as writer:
        writer.write_table(table)
    config = example(tmp_path, ("late: topic", "late: revise"),
                     ("# revision_lateness_ms: 60000", "revision_lateness_ms: 60000"),
                     ("columns: {}", "columns: {latency: median, bytes: {quantile: 0.9}}"),
                     ("expressions: {}",
                      "expressions: {p99: \"pl.col('latency').quantile(0.99)\"}"))
    assert main(["explain", "--config", str(config), "--sample", str(sample)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("windows: tumbling windows of 5 s, by event time")
    assert "kept until the watermark is revision_lateness_ms (1 min) past its end" in out
    assert ("'latency': median -- double, configured in aggregation.columns; buffers the "
            "window's values (a median cannot be merged from the medians of parts)") in out
    assert "'bytes': quantile(0.9) -- int64" in out
    assert ("'p99': pl.col('latency').quantile(0.99) -- buffers the window's values of "
            "'latency'") in out
    assert "buffered per window: 'latency', 'bytes' (counted against " in out


# -- usage mistakes -----------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "says"), [
    (["tail"], "consumer: tail needs --topic TOPIC, or --config with output.topic set"),
    (["tail", "--dlq"], "consumer: tail needs --dlq TOPIC, or --config with output.dlq_topic set"),
    (["tail", "--late"], ("consumer: tail needs --late TOPIC, or --config with "
                         "output.late_topic set")),
    (["tail", "--rows", "0"], ("consumer: argument --rows: '0' must be positive (see python -m "
                              "consumer tail --help)")),
    (["tail", "--topic", "a", "--dlq", "b"], ("consumer: argument --dlq: not allowed with "
                                             "argument --topic (see python -m consumer tail "
                                             "--help)")),
    (["topics", "create", "--partitions", "0"], ("consumer: argument --partitions: '0' must "
                                                "be positive (see python -m consumer topics "
                                                "create --help)")),
    (["frobnicate"], "consumer: argument COMMAND: invalid choice: 'frobnicate' (choose from "),
])
def test_usage_mistakes_are_one_line_and_exit_2(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(says)
    assert line.endswith("--help)") or line == says


# -- no broker ----------------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "mend"), [
    (["tail", "--topic", "sensors-agg", "--idle-timeout-s", "1"],
     "KAFKA_BOOTSTRAP_SERVERS (or --bootstrap-servers)"),
    (["tail", "--topic", "sensors-agg", "--bootstrap-servers", "127.0.0.1:1"],
     "--bootstrap-servers"),
    (["explain", "--config", str(REPO / "config.yaml")],
     f"KAFKA_BOOTSTRAP_SERVERS (it overrides kafka.bootstrap_servers of {REPO}/config.yaml)"),
    (["check", "--config", str(REPO / "config.yaml")],
     f"KAFKA_BOOTSTRAP_SERVERS (it overrides kafka.bootstrap_servers of {REPO}/config.yaml)"),
])
def test_without_a_broker_commands_fail_at_once_in_one_line_naming_the_real_mend(
    argv: list[str], mend: str
) -> None:
    """Nothing listens: said at once (not after librdkafka's 10 s of retries), with the
    place the address was set: the flag, or the variable, or the config file's key."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARROWAGG_")}
    env["KAFKA_BOOTSTRAP_SERVERS"] = "127.0.0.1:1"  # nothing listens on port 1
    done = subprocess.run([sys.executable, "-m", "consumer", *argv], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        "consumer: cannot reach Kafka at 127.0.0.1:1 (nothing listens there: Connection "
        f"refused); check {mend}")
