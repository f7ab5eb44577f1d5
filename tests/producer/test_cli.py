from __future__ import annotations

import time
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

from producer import cli
from producer.generate import SENSOR_SCHEMA


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("producer: ")
    return lines[0]


def read_stream(path: Path) -> list[pa.RecordBatch]:
    with pa.ipc.open_stream(pa.OSFile(str(path))) as reader:
        return list(reader)


def frame_of(table: pa.Table) -> pl.DataFrame:
    result = pl.from_arrow(table)
    assert isinstance(result, pl.DataFrame)
    return result


def test_help_names_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0
    assert "publish" in out
    assert "generate" in out


@pytest.mark.parametrize(("command", "options"), [
    ("publish", ["--topic", "--repeat", "--compression", "--max-message-bytes", "FILE"]),
    ("generate", ["--batches", "--duration-s", "--rows-per-batch", "--groups", "--rate",
                  "--span-ms", "--start-ms", "--seed", "--producers", "--out"]),
])
def test_each_command_explains_its_options(
    capsys: pytest.CaptureFixture[str], command: str, options: list[str]
) -> None:
    code, out, _ = run(capsys, command, "--help")
    assert code == 0
    for option in [*options, "--bootstrap-servers", "KAFKA_BOOTSTRAP_SERVERS"]:
        assert option in out


def test_generate_out_writes_reproducible_rounds(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = ["generate", "--batches", "4", "--rows-per-batch", "50", "--groups", "5",
            "--start-ms", "1000", "--span-ms", "500", "--producers", "2", "--seed", "9"]
    code, out, err = run(capsys, *args, "--out", str(tmp_path / "a.arrows"))
    assert (code, err) == (0, "")
    assert out.startswith("wrote 4 batches (200 rows, ")
    batches = read_stream(tmp_path / "a.arrows")
    assert [batch.num_rows for batch in batches] == [50] * 4
    assert all(batch.schema == SENSOR_SCHEMA for batch in batches)
    # Two producers per round: rounds cover [1000, 1500) and then [1500, 2000).
    spans = [(batch["ts"].cast(pa.int64()).to_pylist()) for batch in batches]
    assert [(min(s) >= lo, max(s) < lo + 500) for s, lo in zip(spans, [1000, 1000, 1500, 1500],
                                                                strict=True)] == [(True, True)] * 4
    assert run(capsys, *args, "--out", str(tmp_path / "b.arrows"))[0] == 0
    again = read_stream(tmp_path / "b.arrows")
    assert_frame_equal(frame_of(pa.Table.from_batches(again)),
                       frame_of(pa.Table.from_batches(batches)))


def test_generate_follows_the_wall_clock_without_start_ms(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    before_ms = time.time_ns() // 1_000_000
    code, _, _ = run(capsys, "generate", "--batches", "2", "--span-ms", "2000",
                     "--out", str(tmp_path / "live.arrows"), "--compression", "zstd")
    after_ms = time.time_ns() // 1_000_000
    assert code == 0
    stamps = pa.Table.from_batches(read_stream(tmp_path / "live.arrows"))["ts"]
    values: list[int] = stamps.cast(pa.int64()).to_pylist()
    assert before_ms - 2000 <= min(values)
    assert max(values) < after_ms  # the span just past: nothing in the future


def test_generate_for_a_duration_at_a_rate(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    began = time.monotonic()
    code, _, _ = run(capsys, "generate", "--duration-s", "0.6", "--rate", "10",
                     "--rows-per-batch", "10", "--out", str(tmp_path / "paced.arrows"))
    assert code == 0
    assert 0.5 <= time.monotonic() - began < 5
    assert 4 <= len(read_stream(tmp_path / "paced.arrows")) <= 7


def test_publish_of_a_missing_file_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = run(capsys, "publish", "--topic", "t", str(tmp_path / "nope.arrows"))
    assert (code, out) == (2, "")
    assert "nope.arrows: no such file" in one_error_line(err)


def test_publish_of_a_non_arrow_file_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "data.csv").write_text("a,b\n1,2\n")
    code, _, err = run(capsys, "publish", "--topic", "t", str(tmp_path / "data.csv"))
    assert code == 2
    assert "not an Arrow IPC stream" in one_error_line(err)


@pytest.mark.parametrize("command", ["publish", "generate"])
def test_an_unreachable_broker_is_one_line_and_exit_1(
    command: str, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The broker failed, not the user's request: exit 1, as the README says."""
    monkeypatch.setattr(cli, "CHECK_TIMEOUT_S", 1.0)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")  # nothing listens on port 1
    assert run(capsys, "generate", "--batches", "1", "--out", str(tmp_path / "x.arrows"))[0] == 0
    source = [str(tmp_path / "x.arrows")] if command == "publish" else ["--batches", "1"]
    code, out, err = run(capsys, command, "--topic", "t", *source)
    assert (code, out) == (1, "")
    line = one_error_line(err)
    assert "cannot reach Kafka at 127.0.0.1:1" in line
    assert line.endswith("with --bootstrap-servers (or KAFKA_BOOTSTRAP_SERVERS, which gave "
                         "this one)")
    code, _, err = run(capsys, command, "--topic", "t", "--bootstrap-servers", "127.0.0.1:1",
                       *source)
    assert code == 1
    assert one_error_line(err).endswith("name another with --bootstrap-servers")


@pytest.mark.parametrize("argv", [
    ["generate", "--batches", "2"],
    ["generate", "--batches", "2", "--topic", "t", "--out", "x.arrows"],
    ["generate", "--batches", "0", "--out", "x.arrows"],
    ["generate", "--batches", "1", "--duration-s", "1", "--out", "x.arrows"],
    ["publish", "--topic", "t"],
    ["publish", "x.arrows"],
    ["publish", "--topic", "t", "--compression", "gzip", "x.arrows"],
    ["publish", "--topic", "t", "--max-message-bytes", "1000", "x.arrows"],
    ["frobnicate"],
    [],
])
def test_usage_errors_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert "--help" in one_error_line(err) or "--topic" in err


def test_an_unwritable_out_file_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run(capsys, "generate", "--out", str(tmp_path / "no" / "such" / "dir.arrows"))
    assert code == 2
    assert "cannot write" in one_error_line(err)
