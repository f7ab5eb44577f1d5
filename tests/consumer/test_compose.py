"""The composition root: which columns the configured windows make keys, and what the
pipeline it builds is configured with."""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

from consumer.compose import build_pipeline
from consumer.config import plan_for, settings_from_dict
from consumer.core.types import InputMessage
from tests.consumer.kafka.rig import ABSENT, SITES, SOURCE, Rig, config
from wire.input import encode_ipc_stream
from wire.repartition import KIND_PARTIAL, record_kind

SCHEMA = pa.schema([("site", pa.string()), ("ts", pa.timestamp("ms", tz="UTC")),
                    ("v", pa.float64())])


COUNT_WINDOW = {"kind": "count", "time": ABSENT, "size_ms": ABSENT, "timestamp_column": "ts"}


@pytest.mark.parametrize(("window", "kind"), [
    ({**COUNT_WINDOW, "count_rows": 10}, "count"),
    ({"time": "processing", "idle_timeout_ms": ABSENT}, "processing-time tumbling"),
])
def test_the_timestamp_column_is_no_key_of_windows_without_event_time(
        window: dict[str, object], kind: str) -> None:
    settings = settings_from_dict(config(window=window))
    plan = plan_for(settings, SCHEMA)
    assert plan.keys == ("site",)
    assert plan.time_column is None
    [skipped] = plan.skipped
    assert skipped.name == "ts"
    assert skipped.reason.startswith(f"window.timestamp_column, which {kind} windows do not use")
    assert "'ts': window.timestamp_column" in plan.describe()


def test_a_timestamp_column_listed_in_the_keys_stays_a_key() -> None:
    settings = settings_from_dict(config(window={**COUNT_WINDOW, "count_rows": 10},
                                         aggregation={"keys": ["site", "ts"]}))
    assert plan_for(settings, SCHEMA).keys == ("site", "ts")


@pytest.mark.parametrize("window", [
    {**COUNT_WINDOW, "count_rows": 1_250},
    {"time": "processing", "idle_timeout_ms": ABSENT, "size_ms": 10_000},
], ids=["count", "processing-time"])
def test_windows_without_event_time_group_by_the_keys_not_by_time(
        window: dict[str, object]) -> None:
    # Each row's distinct time made it a group of its own (issue 12: 991 groups of 1,250).
    rig = Rig(partitions=1, window=window)
    rig.consumer.rebalance("assign", [(SOURCE, 0)])
    for index in range(1_250 // len(SITES) + 1):
        rig.publish(0, pa.table({
            "site": list(SITES),
            "ts": pa.array([index * 10 + i for i in range(len(SITES))],
                           pa.timestamp("ms", tz="UTC")),
            "v": [1.0] * len(SITES)}))
    rig.turns(5)
    rig.clock.now_ms += 10_000  # past the processing-time window's end
    rig.turns(2)
    got = rig.output().select("site", "v", "row_count").sort("site")
    rows = sum(t.num_rows for t in rig.published)
    expected = pl.DataFrame({"site": list(SITES), "v": [rows / 3] * 3,
                             "row_count": [rows // 3] * 3},
                            schema_overrides={"row_count": pl.Int64})
    assert_frame_equal(got, expected, check_dtypes=False)


# The first bytes of a compressed buffer's frame in an Arrow IPC body (after its length).
LZ4_FRAME, ZSTD_FRAME = b"\x04\x22\x4d\x18", b"\x28\xb5\x2f\xfd"


@pytest.mark.parametrize(("output_codec", "scale_out", "frame", "not_frame"), [
    ("zstd", {}, LZ4_FRAME, ZSTD_FRAME),
    ("lz4", {"compression": "zstd"}, ZSTD_FRAME, LZ4_FRAME),
], ids=["default", "zstd"])
def test_stage_one_compresses_its_partials_with_the_scale_outs_codec_not_the_outputs(
        output_codec: str, scale_out: dict[str, object], frame: bytes,
        not_frame: bytes) -> None:
    settings = settings_from_dict(config(
        output={"compression": output_codec},
        scale_out={"repartition_topic": "rep", "partitions": 2, **scale_out}), environ={})
    pipeline = build_pipeline(settings)
    pipeline.assign((SOURCE, 0), None, None, 0)
    rows = pa.table({"site": [f"site-{i % 50}" for i in range(5_000)],
                     "ts": pa.array(range(5_000), pa.timestamp("ms", tz="UTC")),
                     "v": [float(i % 7) for i in range(5_000)]})
    pipeline.process([InputMessage((SOURCE, 0), 0, encode_ipc_stream(rows))], 0)
    partials = [r for r in pipeline.flush(0, force=True).records
                if r.topic == "rep" and record_kind(r.headers) == KIND_PARTIAL]
    assert partials, "the closed window went out as partial states"
    for record in partials:
        assert record.value is not None
        assert frame in record.value
        assert not_frame not in record.value
