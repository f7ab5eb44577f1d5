"""Session windows as a user configures them: the settings, the engine they build, and
what ``explain`` says about the chosen windows."""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
import yaml

from consumer.cli import main
from consumer.compose import build_engine
from consumer.config import ConfigError, plan_for, settings_from_dict
from consumer.core.plan import PlanError
from consumer.core.windows.session.engine import SessionWindowEngine
from consumer.kafka.tail_views import print_window
from tests.conftest import REPO
from wire.output import OutputWindow

SCHEMA = pa.schema([("site", pa.string()), ("ts", pa.timestamp("ms", "UTC")),
                    ("reading_sum", pa.float64())])


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith("ARROWAGG_") or name == "KAFKA_BOOTSTRAP_SERVERS":
            monkeypatch.delenv(name)
    root = logging.getLogger()  # main() configures logging for the process
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def document(window: dict[str, Any]) -> dict[str, Any]:
    return {"input": {"topics": ["in"]}, "output": {"topic": "out"}, "window": window}


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        ({"kind": "session", "timestamp_column": "ts"}, "session windows need gap_ms"),
        ({"kind": "session", "gap_ms": 100}, "event-time windows need timestamp_column"),
        ({"kind": "session", "gap_ms": 100, "size_ms": 1_000, "timestamp_column": "ts"},
         "session windows take gap_ms (and max_session_ms), not size_ms or step_ms"),
    ],
)
def test_inconsistent_sessions_are_rejected_in_one_line(window: dict[str, Any],
                                                        expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        settings_from_dict(document(window), source="config.yaml")
    assert str(info.value) == f"config.yaml: window: {expected}"


@pytest.mark.parametrize("key", ["gap_ms", "max_session_ms"])
def test_session_lengths_must_be_positive(key: str) -> None:
    window = {"kind": "session", "gap_ms": 100, "timestamp_column": "ts", key: 0}
    with pytest.raises(ConfigError) as info:
        settings_from_dict(document(window), source="config.yaml")
    assert str(info.value).startswith(f"config.yaml: window.{key}: ")


@pytest.mark.parametrize("time", ["event", "processing"])
def test_session_settings_build_the_session_engine(time: str) -> None:
    settings = settings_from_dict(document({
        "kind": "session", "time": time, "timestamp_column": "ts", "gap_ms": 30_000,
        "max_session_ms": 3_600_000}))
    plan = plan_for(settings, SCHEMA)
    engine = build_engine(settings, plan, pl.Datetime("ms", "UTC") if time == "event" else None)
    assert isinstance(engine, SessionWindowEngine)
    assert plan.time_column == ("ts" if time == "event" else None)


@pytest.mark.parametrize(
    ("window", "line"),
    [
        ({"kind": "session", "timestamp_column": "ts", "gap_ms": 30_000,
          "max_session_ms": 3_600_000, "allowed_lateness_ms": 500},
         ("windows: session windows per keys with a gap of 30 s, at most 1 h long (cut at "
          "its multiples since the epoch), by event time from column 'ts'")),
        ({"kind": "session", "time": "processing", "gap_ms": 1_000},
         ("windows: session windows per keys with a gap of 1 s, by processing time: each "
          "message's Kafka timestamp is the time of its rows")),
        ({"kind": "tumbling", "timestamp_column": "ts", "size_ms": 5_000},
         "windows: tumbling windows of 5 s, by event time from column 'ts'"),
        ({"kind": "hopping", "time": "processing", "size_ms": 5_000, "step_ms": 1_000},
         ("windows: hopping windows of 5 s every 1 s (each row counts in 5 windows), by "
          "processing time")),
        ({"kind": "count", "count_rows": 10_000},
         "windows: count windows: a window closes after 10000 rows"),
    ],
)
def test_explain_names_the_windows_before_the_aggregates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], window: dict[str, Any], line: str,
) -> None:
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["window"] = window
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    sample = tmp_path / "sample.arrows"
    with pa.ipc.new_stream(sample, SCHEMA) as writer:
        writer.write_table(SCHEMA.empty_table())
    assert main(["explain", "--config", str(path), "--sample", str(sample)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the window words are wrapped
    assert out.startswith(line)
    assert "'reading_sum': sum" in out


def test_tail_shows_each_sessions_own_bounds_even_when_a_message_holds_one() -> None:
    utc = pl.Datetime("ms", "UTC")
    sessions = pl.DataFrame({
        "window_start": [1_000, 5_000], "window_end": [1_400, 5_100], "site": ["a", "b"],
        "row_count": [3, 1]}).with_columns(pl.col("window_start", "window_end").cast(utc))
    shown = []
    for frame in (sessions, sessions.head(1)):
        out = io.StringIO()
        print_window(OutputWindow(0, 10_000, final=True, revision=0, window_rows=4,
                                  chunk=(1, 1), frame=frame), out)
        shown.append(out.getvalue())
    assert "00:00:01.400" in shown[0]  # each session's end, in its row
    assert "00:00:05.100" in shown[0]
    assert "00:00:01.400" in shown[1], "one session: its bounds stay in the table"



def test_revising_sessions_keep_replaces_for_themselves_and_say_so_in_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    window = {"kind": "session", "timestamp_column": "ts", "gap_ms": 1_000, "late": "revise",
              "revision_lateness_ms": 60_000}
    settings = settings_from_dict({**document(window), "aggregation": {
        "columns": {"reading_sum": "median"}}})
    plan = plan_for(settings, SCHEMA)
    assert isinstance(build_engine(settings, plan, pl.Datetime("ms", "UTC")),
                      SessionWindowEngine)
    taken = pa.schema([*SCHEMA, ("replaces", pa.int64())])
    with pytest.raises(PlanError, match="column 'replaces' clashes with a result column"):
        plan_for(settings, taken)
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["window"] = window
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["check", "--config", str(path), "--offline"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert ("An emitted session is kept until the watermark is revision_lateness_ms (1 min) "
            "past its end") in said


def test_tail_says_how_many_held_sessions_a_revision_replaced() -> None:
    utc = pl.Datetime("ms", "UTC")
    session = pl.DataFrame({"window_start": [1_000], "window_end": [1_400], "site": ["a"],
                            "row_count": [3]}).with_columns(
        pl.col("window_start", "window_end").cast(utc))
    out = io.StringIO()
    print_window(OutputWindow(1_000, 1_400, final=True, revision=2, window_rows=3,
                              chunk=(1, 1), frame=session, kind="update", sessions=True,
                              replaced=pl.concat([session, session])), out)
    assert out.getvalue().startswith(
        "sessions [1970-01-01T00:00:01.000Z, 1970-01-01T00:00:01.400Z): 1 sessions, 3 input "
        "rows, final, revision 2 (whole sessions, replacing those they name); replacing 2 "
        "held session rows")
