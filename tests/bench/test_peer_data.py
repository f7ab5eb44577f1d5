"""The end-to-end peers' input, output reading, correctness check and timing, without the
peers (their interpreters are ``make bench``'s) and without a broker."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from pyarrow import ipc

from bench import peer_data
from bench.payloads import START_MS, WINDOW_MS, Payloads
from wire.output import encode_window

AGGREGATES = ("reading_sum", "reading_count", "reading_min", "reading_max", "power",
              "error_count")


@pytest.fixture(scope="module")
def payloads() -> Payloads:
    return peer_data.slice_payloads(2)


@pytest.fixture(scope="module")
def expected(payloads: Payloads) -> pl.DataFrame:
    return peer_data.reference(payloads)


def test_the_slice_has_every_group_in_every_window(expected: pl.DataFrame) -> None:
    assert expected.height == 2 * peer_data.GROUPS
    per_window = peer_data.ROWS_PER_MESSAGE * peer_data.MESSAGES_PER_WINDOW
    assert expected["row_count"].sum() == 2 * per_window
    assert expected["window_start"].unique().sort().to_list() == [START_MS,
                                                                   START_MS + WINDOW_MS]


def test_json_rows_carry_the_arrow_rows_exactly(payloads: Payloads) -> None:
    value = payloads.values[0]
    lines = peer_data.json_rows(value)
    assert len(lines) == peer_data.ROWS_PER_MESSAGE
    table = ipc.open_stream(value).read_all()
    original = pl.from_arrow(table)
    assert isinstance(original, pl.DataFrame)
    back = pl.DataFrame([json.loads(line) for line in lines])
    assert back["ts"].dtype == pl.Int64
    assert_frame_equal(back, original.with_columns(pl.col("ts").dt.epoch("ms")),
                       check_exact=True)


def test_the_closing_rows_hold_every_group_far_past_the_data(payloads: Payloads) -> None:
    table = ipc.open_stream(peer_data.closing_arrow(payloads)).read_all()
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    assert frame.select("site", "sensor").unique().height == peer_data.GROUPS
    closing = peer_data.closing_window_ms(payloads)
    earliest = frame["ts"].dt.epoch("ms").min()
    assert isinstance(earliest, int)
    assert earliest >= closing
    assert closing >= START_MS + (payloads.windows + 1) * WINDOW_MS


# -- each peer's natural output, read back ------------------------------------------------


def _rows(expected: pl.DataFrame) -> list[dict[str, Any]]:
    return expected.to_dicts()


def quix_records(expected: pl.DataFrame) -> list[peer_data.OutputRecord]:
    return [peer_data.OutputRecord(
        f"{r['site']}|{r['sensor']}".encode(),
        json.dumps({"start": r["window_start"], "end": r["window_start"] + WINDOW_MS,
                    **{a: r[a] for a in AGGREGATES}, "row_count": r["row_count"]}).encode(),
    ) for r in _rows(expected)]


def bytewax_records(expected: pl.DataFrame) -> list[peer_data.OutputRecord]:
    return [peer_data.OutputRecord(
        f"{r['site']}|{r['sensor']}".encode(),
        json.dumps({**r, "window_end": r["window_start"] + WINDOW_MS}).encode(),
    ) for r in _rows(expected)]


def denormalized_records(expected: pl.DataFrame) -> list[peer_data.OutputRecord]:
    def iso(ms: int) -> str:
        return datetime.fromtimestamp(ms / 1000, UTC).replace(tzinfo=None).isoformat()

    return [peer_data.OutputRecord(None, json.dumps({
        "site_sensor": f"{r['site']}|{r['sensor']}", **{a: r[a] for a in AGGREGATES},
        "row_count": r["row_count"], "window_start_time": iso(r["window_start"]),
        "window_end_time": iso(r["window_start"] + WINDOW_MS),
    }).encode()) for r in _rows(expected)]


def arrowagg_records(expected: pl.DataFrame) -> list[peer_data.OutputRecord]:
    records = []
    for (start,), frame in expected.partition_by("window_start", as_dict=True).items():
        assert isinstance(start, int)
        window = frame.with_columns(
            pl.col("window_start").cast(pl.Datetime("ms", "UTC")),
            window_end=pl.lit(start + WINDOW_MS).cast(pl.Datetime("ms", "UTC")),
            site=pl.col("site").cast(pl.Categorical), sensor=pl.col("sensor").cast(
                pl.Categorical))
        records += [peer_data.OutputRecord(m.key, m.value, m.headers) for m in encode_window(
            window, start_ms=start, end_ms=start + WINDOW_MS,
            input_rows=int(frame["row_count"].sum()), fmt="arrow", compression="zstd",
            max_bytes=4_000)]
    return records


def flink_records(expected: pl.DataFrame) -> list[peer_data.OutputRecord]:
    """The sink table's rows as Flink's JSON format writes them: TIMESTAMP(3) as SQL text."""
    def sql(ms: int) -> str:
        return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")

    return [peer_data.OutputRecord(None, json.dumps({
        "window_start": sql(r["window_start"]), "window_end": sql(r["window_start"] + WINDOW_MS),
        "site": r["site"], "sensor": r["sensor"], **{a: r[a] for a in AGGREGATES},
        "row_count": r["row_count"],
    }).encode()) for r in _rows(expected)]


def kstreams_records(expected: pl.DataFrame) -> list[peer_data.OutputRecord]:
    """SensorWindows.Result as Jackson writes it, keyed by the groupBy key."""
    return [peer_data.OutputRecord(f"{r['site']}|{r['sensor']}".encode(), json.dumps({
        "window_start": r["window_start"], "window_end": r["window_start"] + WINDOW_MS,
        "site": r["site"], "sensor": r["sensor"], **{a: r[a] for a in AGGREGATES},
        "row_count": r["row_count"],
    }).encode()) for r in _rows(expected)]


SHAPES: dict[peer_data.ResultShape, Callable[[pl.DataFrame], list[peer_data.OutputRecord]]] = {
    "arrowagg": arrowagg_records, "quix": quix_records, "bytewax": bytewax_records,
    "denormalized": denormalized_records, "flink": flink_records, "kstreams": kstreams_records,
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_each_peers_output_reads_back_as_the_reference(
    shape: peer_data.ResultShape, expected: pl.DataFrame,
) -> None:
    records = SHAPES[shape](expected)
    got = peer_data.results_frame(shape, records)
    assert peer_data.check(got, expected) is None
    assert_frame_equal(got.select(expected.columns), expected, check_exact=False,
                       rel_tol=1e-12)


def test_flinks_timestamps_read_with_or_without_milliseconds() -> None:
    start = START_MS + 3 * WINDOW_MS
    for text in ("2025-01-01 00:00:30", "2025-01-01T00:00:30.000", "2025-01-01 00:00:30.000"):
        record = peer_data.OutputRecord(None, json.dumps({
            "window_start": text, "window_end": "2025-01-01 00:00:40", "site": "s",
            "sensor": "t", "row_count": 1}).encode())
        assert peer_data.results_frame("flink", [record])["window_start"].to_list() == [start]


def test_no_output_is_all_missing(expected: pl.DataFrame) -> None:
    wrong = peer_data.check(peer_data.results_frame("quix", []), expected)
    assert wrong is not None
    assert f"{expected.height:,} missing" in wrong


# -- the check ------------------------------------------------------------------------------


def test_a_value_off_by_more_than_rounding_is_wrong(expected: pl.DataFrame) -> None:
    off = expected.with_columns(
        pl.when(pl.int_range(pl.len()) == 7).then(pl.col("power") * (1 + 1e-6))
        .otherwise(pl.col("power")).alias("power"))
    wrong = peer_data.check(off, expected)
    assert wrong is not None
    assert wrong.startswith("values differ")
    rounded = expected.with_columns(pl.col("power") * (1 + 1e-13))
    assert peer_data.check(rounded, expected) is None


def test_missing_twice_and_unexpected_results_are_counted(expected: pl.DataFrame) -> None:
    stray = expected.head(1).with_columns(pl.col("window_start") + 5 * WINDOW_MS)
    got = pl.concat([expected.slice(2), expected.slice(2, 1), stray])
    assert peer_data.check(got, expected) == (
        f"{got.height:,} results for {expected.height:,} (window, group) pairs: "
        "2 missing, 1 unexpected, 1 emitted more than once")


def closed_at_first_row_of_last_ms(payloads: Payloads) -> pl.DataFrame:
    """What Flink SQL gave with ``WATERMARK FOR event_time AS event_time``: a window closes
    at the first row of its last millisecond and its rows after that one are dropped as
    late. The surviving rows aggregated by DuckDB, not by the code under test."""
    import duckdb  # noqa: PLC0415 - loads slowly

    rows = pl.concat([pl.DataFrame([json.loads(line) for line in peer_data.json_rows(v)])
                      for v in payloads.values])
    window_end = (pl.col("ts") // WINDOW_MS + 1) * WINDOW_MS
    seen = pl.col("ts").cum_max().shift(1, fill_value=0)
    kept = rows.filter(window_end - 1 > seen)
    con = duckdb.connect()
    try:
        con.register("kept", kept)
        frame = pl.from_arrow(con.sql(
            "SELECT ts // $w * $w AS window_start, site, sensor, SUM(reading_sum) AS "
            "reading_sum, SUM(reading_count)::BIGINT AS reading_count, MIN(reading_min) AS "
            "reading_min, MAX(reading_max) AS reading_max, SUM(power) AS power, "
            "SUM(error_count)::BIGINT AS error_count, COUNT(*) AS row_count "
            "FROM kept GROUP BY ALL ORDER BY ALL", params={"w": WINDOW_MS}).to_arrow_table())
    finally:
        con.close()
    assert isinstance(frame, pl.DataFrame)
    return frame


def test_rows_dropped_as_late_make_a_peer_wrong(
    payloads: Payloads, expected: pl.DataFrame,
) -> None:
    wrong_peer = closed_at_first_row_of_last_ms(payloads)
    assert wrong_peer["row_count"].sum() < expected["row_count"].sum()  # rows were dropped
    got = peer_data.results_frame("flink", flink_records(wrong_peer))
    wrong = peer_data.check(got, expected)
    assert wrong is not None
    assert wrong.startswith("values differ")


def test_a_window_split_in_pieces_is_wrong(expected: pl.DataFrame) -> None:
    """What Denormalized does on two cores: a window's group comes out in two rows."""
    first = expected.head(1)
    pieces = pl.concat([expected.slice(1), first.with_columns(pl.col("row_count") - 1),
                        first.with_columns(pl.lit(1, pl.Int64).alias("row_count"))])
    wrong = peer_data.check(pieces.sort("window_start", "site", "sensor"), expected)
    assert wrong is not None
    assert "1 emitted more than once" in wrong


def test_the_closing_window_is_left_out_but_nothing_else(
    payloads: Payloads, expected: pl.DataFrame,
) -> None:
    closing = peer_data.closing_window_ms(payloads)
    extra = expected.head(2).with_columns(
        pl.Series("window_start", [closing, closing - WINDOW_MS]))
    kept = peer_data.data_results(pl.concat([expected, extra]), payloads)
    assert kept.height == expected.height + 1
    assert peer_data.check(kept, expected) is not None


# -- timing and what the runners print ------------------------------------------------------


def test_startup_is_apart_from_the_steady_rate() -> None:
    got = peer_data.timing(1_000, launched=100.0, first_input=101.5, last_result=103.5)
    assert got == {"startup_s": 1.5, "steady_s": 2.0, "rows_per_s": 500.0,
                   "launch_to_last_s": 3.5, "launch_to_last_rows_per_s": 1_000 / 3.5}


def test_times_out_of_order_are_refused() -> None:
    with pytest.raises(ValueError, match="out of order"):
        peer_data.timing(10, launched=5.0, first_input=4.0, last_result=6.0)


def test_the_runners_lines_are_merged_and_chatter_ignored() -> None:
    lines = ['{"first_input": 1.5}', "Received SIGTERM, initiating shutdown...",
             '{"committed": 2.0}', "{not json", '{"committed": 3.0}']
    assert peer_data.reported(lines) == {"first_input": 1.5, "committed": 3.0}

