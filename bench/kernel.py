"""The aggregation kernel: the same pre-encoded payloads through arrowagg and its peers.

- arrowagg: the daemon's own pipeline (``bench.daemon_path``: decode, window,
  pre-aggregate, close, encode), ``poll_messages`` messages a poll, without Kafka;
- DataFusion: the batches registered as a table, the seed's SQL GROUP BY;
- DuckDB: the same SQL over the same Arrow table;
- naive Polars: ``pl.from_arrow`` each message, ``pl.concat``, one ``group_by``.

The seed's rules choose the SQL: string columns group, ``*_sum``/``*_count`` and other
numerics are summed, ``*_min``/``*_max`` take the minimum/maximum. Its timestamp rule
("timestamps group") becomes the window here: the time column is bucketed into the
10-second tumbling window, as arrowagg's plan does. Every peer's result is checked
against arrowagg's before any time counts.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import datafusion
import duckdb
import polars as pl
import pyarrow as pa
from polars.testing import assert_frame_equal
from pyarrow import ipc

from bench.daemon_path import PipelineDriver, bench_settings
from bench.payloads import WINDOW_MS, Payloads
from consumer.core.plan import AggregationPlan, derive_plan
from consumer.core.types import ClosedWindow

PEERS = ("arrowagg", "datafusion", "duckdb", "polars_naive")
_IDLE_MS = 60_000


def seed_sql(schema: pa.Schema, table: str, window: str) -> str:
    """The seed's build_sql_query, with its timestamp key replaced by ``window``."""
    plan = _plan(schema)
    funcs = {"sum": "SUM", "min": "MIN", "max": "MAX"}
    select = [f"{window} AS window_start", *(_quote(k) for k in plan.keys)]
    select += [f"{funcs[a.func]}({_quote(a.name)}) AS {_quote(a.name)}" for a in plan.aggregates]
    select.append("COUNT(*) AS row_count")
    keys = ", ".join(str(i) for i in range(1, len(plan.keys) + 2))
    return f'SELECT {", ".join(select)} FROM "{table}" GROUP BY {keys}'  # noqa: S608


def _plan(schema: pa.Schema) -> AggregationPlan:
    return derive_plan(schema, time_column="ts")


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


# -- the peers: each takes the payloads and returns the result (any frame-like) ----------


def run_arrowagg(payloads: Payloads, poll_messages: int) -> pl.DataFrame:
    return pl.concat([w.frame for w in arrowagg_windows(payloads, poll_messages)])


def arrowagg_windows(payloads: Payloads, poll_messages: int) -> list[ClosedWindow]:
    """The windows the daemon's pipeline closes over ``payloads`` (encoded, as it does)."""
    driver = PipelineDriver(bench_settings({
        "kind": "tumbling", "time": "event", "timestamp_column": "ts", "size_ms": WINDOW_MS,
        "allowed_lateness_ms": 0, "idle_timeout_ms": _IDLE_MS,
        # The bench's clock starts at 0, so every event time would be in its future.
        "max_future_ms": None}))
    values = payloads.values
    windows = []
    for first in range(0, len(values), poll_messages):
        windows += driver.poll(values[first:first + poll_messages], 0)
    windows += driver.flush(_IDLE_MS + 1)  # every partition idle: the last windows close
    return windows


def _batches(payloads: Payloads) -> list[pa.RecordBatch]:
    return [batch for value in payloads.values for batch in ipc.open_stream(value)]


def run_datafusion(payloads: Payloads, _poll: int) -> pa.Table:
    batches = _batches(payloads)
    ctx = datafusion.SessionContext()
    ctx.register_record_batches("sensors", [batches])
    window = (f"date_bin(INTERVAL '{WINDOW_MS} milliseconds', ts, "
              "TIMESTAMP '1970-01-01T00:00:00Z')")
    return ctx.sql(seed_sql(batches[0].schema, "sensors", window)).to_arrow_table()


def run_duckdb(payloads: Payloads, _poll: int) -> pa.Table:
    sensors = pa.Table.from_batches(_batches(payloads))
    con = duckdb.connect()
    try:
        con.register("sensors", sensors)
        window = f"epoch_ms(ts) // {WINDOW_MS} * {WINDOW_MS}"
        result: pa.Table = con.sql(seed_sql(sensors.schema, "sensors", window)).to_arrow_table()
        return result
    finally:
        con.close()


def seed_aggregates(plan: AggregationPlan) -> list[pl.Expr]:
    """The seed's aggregates in Polars, as the SQL peers compute them, and the row count."""
    return [*(POLARS_FUNCS[a.func](pl.col(a.name)) for a in plan.aggregates),
            pl.len().alias("row_count")]


# The seed's functions as Polars expressions (its rules give only these three).
POLARS_FUNCS = {"sum": pl.Expr.sum, "min": pl.Expr.min, "max": pl.Expr.max}


def run_polars_naive(payloads: Payloads, _poll: int) -> pl.DataFrame:
    frames = [pl.from_arrow(ipc.open_stream(value).read_all()) for value in payloads.values]
    rows = pl.concat([f for f in frames if isinstance(f, pl.DataFrame)])
    plan = _plan(_schema(payloads))
    window = pl.col("ts").dt.epoch("ms") // WINDOW_MS * WINDOW_MS
    return rows.group_by(window.alias("window_start"), *plan.keys).agg(seed_aggregates(plan))


def _schema(payloads: Payloads) -> pa.Schema:
    return schema_of(payloads.values[0])


def schema_of(value: bytes) -> pa.Schema:
    return ipc.open_stream(value).schema


RUNNERS: dict[str, Callable[[Payloads, int], Any]] = {
    "arrowagg": run_arrowagg, "datafusion": run_datafusion, "duckdb": run_duckdb,
    "polars_naive": run_polars_naive,
}


# -- checking and timing -----------------------------------------------------------------


def normalised(result: Any) -> pl.DataFrame:
    """Any peer's result as one comparable frame: Int64 window start, string keys, sorted."""
    frame = result if isinstance(result, pl.DataFrame) else pl.from_arrow(result)
    assert isinstance(frame, pl.DataFrame)  # noqa: S101
    start = frame.schema["window_start"]
    ms = (pl.col("window_start").dt.epoch("ms") if isinstance(start, pl.Datetime)
          else pl.col("window_start").cast(pl.Int64))
    keys = [n for n, t in frame.schema.items() if t in (pl.String, pl.Categorical)
            or isinstance(t, pl.Categorical | pl.Enum)]
    columns = [c for c in frame.columns if c not in ("window_start", "window_end")]
    frame = frame.select(ms.alias("window_start"), *columns).with_columns(
        pl.col(keys).cast(pl.String), pl.col("row_count").cast(pl.Int64))
    numeric = [c for c in columns if c not in keys and c != "row_count"]
    frame = frame.with_columns(pl.col(n).cast(pl.Float64) for n in numeric)
    return frame.sort("window_start", *keys)


def check_agreement(results: dict[str, Any]) -> None:
    """Every peer gives arrowagg's groups and values (floats to 1e-9 relative)."""
    reference = normalised(results["arrowagg"])
    for peer, result in results.items():
        got = normalised(result).select(reference.columns)
        try:
            assert_frame_equal(got, reference, check_exact=False, rel_tol=1e-9)
        except AssertionError as err:
            raise AssertionError(f"{peer} disagrees with arrowagg: {err}") from err


def interleaved_seconds(runners: dict[str, Callable[[], object]],
                        repetitions: int) -> dict[str, list[float]]:
    """Seconds of each run, the runners taking turns in every repetition so drift hits
    all alike; garbage is collected before each, outside the clock."""
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repetitions):
        for name, run in runners.items():
            gc.collect()
            started = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - started)
    return seconds


def measure(payloads: Payloads, *, repetitions: int, poll_messages: int,
            peers: tuple[str, ...] = PEERS, extra: dict[str, Callable[[Payloads, int], Any]]
            | None = None, read_back: Callable[[Any], Any] = lambda result: result,
            ) -> dict[str, Any]:
    """Median seconds per peer; repetitions interleave the peers so drift hits all alike.
    ``extra``: more runners timed with them, whose results ``read_back`` makes rows to
    check (``bench.kernel_floor``'s floors, which end in encoded output)."""
    runners = {**{p: RUNNERS[p] for p in peers}, **(extra or {})}
    check_agreement({name: run(payloads, poll_messages) if name in peers else
                     read_back(run(payloads, poll_messages)) for name, run in runners.items()})
    seconds = interleaved_seconds(
        {name: partial(run, payloads, poll_messages) for name, run in runners.items()},
        repetitions)
    figures: dict[str, Any] = {}
    for peer, runs in seconds.items():
        median = statistics.median(runs)
        figures[peer] = {"seconds": runs, "median_s": median,
                         "rows_per_s": payloads.rows / median,
                         "mb_per_s": payloads.nbytes / median / 1e6}
    return {
        "case": payloads.case.name, "encoding": payloads.encoding, "rows": payloads.rows,
        "groups": payloads.case.groups, "messages": len(payloads.values),
        "bytes": payloads.nbytes, "windows": payloads.windows, "poll_messages": poll_messages,
        "agreement": "every peer equals arrowagg", "peers": figures,
    }
