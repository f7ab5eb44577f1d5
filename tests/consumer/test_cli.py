"""`python -m consumer` as a user meets it: help, bad config, explain."""

from __future__ import annotations

import logging
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
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for command in ("run", "explain", "tail"):
        assert command in text
    for command in ("run", "explain", "tail"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert "--" in capsys.readouterr().out


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
    config.write_text((REPO / "config.yaml").read_text().replace(
        "timestamp_column: ts", "timestamp_column: none_here").replace(
        "time: event ", "time: processing "))
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


def test_explain_rejects_an_unreadable_sample(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.arrows"
    bad.write_bytes(b"not arrow at all")
    assert main(["explain", "--config", str(REPO / "config.yaml"), "--sample", str(bad)]) == 2
    assert "cannot read it" in capsys.readouterr().err
