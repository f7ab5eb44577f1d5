"""What the end-to-end peers are given and what they give back, without Kafka.

Every peer drains the same kind of slice: 20,000 rows a 10-second window over 200
(site, sensor) groups, as Arrow IPC messages of 10,000 rows (``bench.payloads``) or, for
the peers that read JSON, the same rows one JSON object per message. Each peer writes its
results in its own natural shape; ``results_frame`` reads every shape back into the frame
``bench.kernel.normalised`` makes, and ``check`` compares it with the DuckDB reference
(the seed's SQL over the same payloads, as the kernel section computes it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import polars as pl
from polars.testing import assert_frame_equal
from pyarrow import ipc

from bench.payloads import START_MS, WINDOW_MS, Payloads, build, window_tables
from bench.sizes import KernelCase
from wire.input import encode_ipc_stream
from wire.output import decode_output

ROWS_PER_MESSAGE = 10_000
GROUPS = 200
MESSAGES_PER_WINDOW = 2
CLOSING_GAP = 10  # windows between the data's last one and the closing rows' window
KEYS = ("window_start", "site", "sensor")
ResultShape = Literal["arrowagg", "quix", "bytewax", "denormalized", "flink", "kstreams"]


def slice_payloads(windows: int) -> Payloads:
    """``windows`` windows of the peers' slice, plain (utf8) keys: what any pyarrow
    worker sends."""
    case = KernelCase(f"peer slice, {windows} windows", windows * MESSAGES_PER_WINDOW,
                      ROWS_PER_MESSAGE, GROUPS, MESSAGES_PER_WINDOW)
    return build(case, "plain")


def closing_arrow(payloads: Payloads) -> bytes:
    """One row per group in a far later window: it moves every peer's watermark past the
    data, Bytewax's and Denormalized's too, which keep one per key."""
    case = KernelCase("closing", 1, GROUPS, GROUPS, 1)
    (table,) = window_tables(case, payloads.encoding, payloads.windows + CLOSING_GAP)
    return encode_ipc_stream(table)


def closing_window_ms(payloads: Payloads) -> int:
    return START_MS + (payloads.windows + CLOSING_GAP) * WINDOW_MS


def json_rows(value: bytes) -> list[bytes]:
    """One Arrow IPC message as JSON objects, one a row, ``ts`` in epoch milliseconds:
    what a worker that writes JSON sends. Floats keep every digit (shortest round trip)."""
    frame = pl.from_arrow(ipc.open_stream(value).read_all())
    assert isinstance(frame, pl.DataFrame)  # noqa: S101 - a table makes a frame
    frame = frame.with_columns(pl.col("ts").dt.epoch("ms"))
    return frame.write_ndjson().encode().splitlines()


def reference(payloads: Payloads) -> pl.DataFrame:
    """The seed's SQL in DuckDB over the slice, normalised as the kernel section does."""
    from bench.kernel import normalised, run_duckdb  # noqa: PLC0415 - duckdb loads slowly

    return normalised(run_duckdb(payloads, 0))


# -- reading results back ----------------------------------------------------------------


@dataclass(frozen=True)
class OutputRecord:
    """One message of a peer's output topic."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None = None


def results_frame(shape: ResultShape, records: Sequence[OutputRecord]) -> pl.DataFrame:
    """Every result row the peer wrote, as ``normalised`` frames them (window_start in
    epoch ms, string keys, Float64 aggregates, Int64 row_count)."""
    from bench.kernel import normalised  # noqa: PLC0415

    if shape == "arrowagg":
        frames = [decode_output(r.value, r.headers).frame for r in records]
        frame = pl.concat(frames, how="vertical_relaxed") if frames else _empty()
    else:
        rows = [_json_result(shape, r) for r in records]
        frame = pl.DataFrame(rows, infer_schema_length=None) if rows else _empty()
    return normalised(frame.with_columns(pl.col("site", "sensor").cast(pl.String)))


def _json_result(shape: ResultShape, record: OutputRecord) -> dict[str, Any]:
    row: dict[str, Any] = json.loads(record.value or b"null")
    if shape == "quix":  # {"start", "end", aggregates}, keyed by the group_by key
        row["window_start"] = row.pop("start")
        row.pop("end")
        row["site"], row["sensor"] = (record.key or b"").decode().split("|")
    elif shape == "denormalized":  # site_sensor, aggregates, window_start_time (naive UTC)
        row["site"], row["sensor"] = row.pop("site_sensor").split("|")
        row["window_start"] = _epoch_ms(row.pop("window_start_time"))
        row.pop("window_end_time")
    elif shape == "flink":  # the sink table's columns; TIMESTAMP(3) in UTC as SQL text
        row["window_start"] = _epoch_ms(row["window_start"])
        row.pop("window_end")
    else:  # bytewax, kstreams: written as arrowagg's JSON rows are
        row.pop("window_end", None)
    return row


def _epoch_ms(naive_utc: str) -> int:
    """'2025-01-01 00:00:00' or '2025-01-01T00:00:00.000' (UTC, no zone) in epoch ms."""
    start = datetime.fromisoformat(naive_utc).replace(tzinfo=UTC)
    return int(start.timestamp() * 1000)


def _empty() -> pl.DataFrame:
    return pl.DataFrame(schema={"window_start": pl.Int64, "site": pl.String,
                                "sensor": pl.String, "row_count": pl.Int64})


def data_results(frame: pl.DataFrame, payloads: Payloads) -> pl.DataFrame:
    """Without the closing rows' window (a peer that closes it too is not wrong)."""
    return frame.filter(pl.col("window_start") < closing_window_ms(payloads))


def check(got: pl.DataFrame, expected: pl.DataFrame) -> str | None:
    """None when ``got`` holds exactly the expected results (floats to 1e-9 relative);
    otherwise what is wrong, in one line."""
    keys = list(KEYS)
    twice = got.height - got.unique(keys).height
    missing = expected.join(got, on=keys, how="anti").height
    extra = got.join(expected, on=keys, how="anti").height
    if twice or missing or extra:
        return (f"{got.height:,} results for {expected.height:,} (window, group) pairs: "
                f"{missing:,} missing, {extra:,} unexpected, {twice:,} emitted more than once")
    absent = [c for c in expected.columns if c not in got.columns]
    if absent:
        return f"no column {', '.join(absent)} in the results"
    try:
        assert_frame_equal(got.select(expected.columns), expected, check_exact=False,
                           rel_tol=1e-9)
    except AssertionError as err:
        return "values differ from DuckDB's: " + " ".join(str(err).split())[:300]
    return None


# -- timing ------------------------------------------------------------------------------


def timing(rows: int, *, launched: float, first_input: float, last_result: float,
           ) -> dict[str, float]:
    """Startup (launch -> first input message in the peer's hands) apart from the steady
    rate (first input -> last result), and the launch-to-last rate, all in wall seconds."""
    if not launched <= first_input <= last_result:
        raise ValueError(f"times out of order: launched {launched}, first input "
                         f"{first_input}, last result {last_result}")
    steady = last_result - first_input
    whole = last_result - launched
    return {"startup_s": first_input - launched, "steady_s": steady,
            "rows_per_s": rows / steady if steady > 0 else float("inf"),
            "launch_to_last_s": whole, "launch_to_last_rows_per_s": rows / whole}


def reported(lines: Iterable[str]) -> dict[str, Any]:
    """The JSON objects a peer's runner printed on stdout, merged (later keys win); other
    lines (a library's own chatter) are ignored."""
    found: dict[str, Any] = {}
    for line in lines:
        text = line.strip()
        if text.startswith("{"):
            try:
                found.update(json.loads(text))
            except json.JSONDecodeError:
                continue
    return found
