"""The plan that arrival order cannot decide (issue 35): a small file with an extra
string column, read before a large one, fixed the plan and sent the large one to the
DLQ. Pinned by ``aggregation.schema_from``, the plan is the file's whichever message
comes first; unpinned, the dead letter says which plan it was checked against and
where that plan came from. Results are checked against DuckDB."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

from consumer.compose import build_pipeline
from consumer.config import ConfigError, settings_from_dict
from consumer.core.pipeline import Pipeline
from consumer.core.types import InputMessage, OutputRecord, PartitionKey
from wire.input import encode_ipc_stream
from wire.output import decode_output

NOW_MS = 1_800_000_000_000
T0 = NOW_MS - 60_000
P0: PartitionKey = ("in", 0)
P1: PartitionKey = ("in", 1)


def readings(rows: int, *, region: bool) -> pa.Table:
    columns: dict[str, Any] = {
        "site": [f"s{i % 3}" for i in range(rows)],
        "ts": pa.array([T0 + i * 10 for i in range(rows)], pa.timestamp("ms", "UTC")),
        "amount": [float(i % 17) for i in range(rows)],
    }
    if region:
        columns["region"] = ["eu"] * rows
    return pa.table(columns)


LARGE, SMALL = readings(600, region=False), readings(2, region=True)


def write_sample(path: Path, table: pa.Table) -> Path:
    with pa.ipc.new_stream(str(path), table.schema) as writer:
        writer.write_table(table.slice(0, 1))
    return path


def pipeline(**aggregation: Any) -> Pipeline:
    pipe = build_pipeline(settings_from_dict({
        "kafka": {"bootstrap_servers": "unused:9092"},
        "input": {"topics": ["in"]},
        "output": {"topic": "out", "dlq_topic": "dlq"},
        "window": {"kind": "tumbling", "time": "event", "timestamp_column": "ts",
                   "size_ms": 60_000, "idle_timeout_ms": 60_000},
        "aggregation": aggregation,
    }, environ={}))
    for partition in (P0, P1):
        pipe.assign(partition, None, None, NOW_MS)
    return pipe


def small_first(pipe: Pipeline) -> list[OutputRecord]:
    """The 2-row file (on partition 1) is read before the 600-row one (partition 0)."""
    pipe.process([InputMessage(P1, 0, encode_ipc_stream(SMALL))], NOW_MS)
    pipe.process([InputMessage(P0, 0, encode_ipc_stream(LARGE))], NOW_MS)
    return pipe.flush(NOW_MS + 120_000, force=True).records


def test_a_pinned_plan_is_the_files_whichever_message_comes_first(tmp_path: Path) -> None:
    sample = write_sample(tmp_path / "sample.arrows", LARGE)
    records = small_first(pipeline(schema_from=str(sample)))
    assert [r for r in records if r.topic == "dlq"] == []
    got = pl.concat([decode_output(r.value, r.headers).frame for r in records
                     if r.topic == "out"])
    large, small = LARGE, SMALL.drop_columns(["region"])  # noqa: F841 - read by DuckDB
    relation = duckdb.sql("""
        SELECT site, sum(amount) AS amount, count(*) AS row_count
        FROM (SELECT * FROM large UNION ALL SELECT * FROM small) GROUP BY site""")
    assert relation is not None
    expected = relation.pl()
    assert_frame_equal(got.select("site", "amount", "row_count"), expected,
                       check_row_order=False, check_dtypes=False)


def test_unpinned_the_dead_letter_names_the_plan_and_the_message_it_came_from() -> None:
    records = small_first(pipeline())
    [dead] = [r for r in records if r.topic == "dlq"]
    headers = dict(dead.headers)
    assert headers["arrowagg.dlq.original-partition"] == b"0"
    assert headers["arrowagg.dlq.error-message"] == (
        b"missing key/time columns ['region']; checked against the plan from the first "
        b"message with rows, in[1]@0 (pin the plan: aggregation.schema_from)")


def test_a_pinned_plan_names_its_file_in_a_dead_letter(tmp_path: Path) -> None:
    sample = write_sample(tmp_path / "sample.arrows", SMALL)
    records = small_first(pipeline(schema_from=str(sample)))
    [dead] = [r for r in records if r.topic == "dlq"]
    assert dict(dead.headers)["arrowagg.dlq.error-message"] == (
        "missing key/time columns ['region']; checked against the plan from "
        f"aggregation.schema_from ({sample})").encode()


@pytest.mark.parametrize(("sample", "says"), [
    (None, "no such file; check the path"),
    (pa.table({"site": ["a"], "amount": [1.0]}), "time column 'ts' is not in the schema"),
])
def test_a_schema_from_that_gives_no_plan_stops_the_config_from_loading(
    tmp_path: Path, sample: pa.Table | None, says: str,
) -> None:
    path = tmp_path / "sample.arrows"
    if sample is not None:
        write_sample(path, sample)
    with pytest.raises(ConfigError) as raised:
        pipeline(schema_from=str(path))
    assert str(raised.value).startswith(f"config: aggregation.schema_from: {path}: ")
    assert says in str(raised.value)
