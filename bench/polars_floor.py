"""Polars at its best doing arrowagg's whole job: the floor the kernel and end-to-end
sections set arrowagg against.

Every shape reads the same messages with pyarrow (no validation; plain strings read as
string views, as arrowagg's ``poll_frame`` reads them), groups them with Polars'
streaming ``group_by`` into the seed's aggregates per (window, keys), and encodes each
window as arrowagg encodes its own (``wire.output.encode_window``: Arrow IPC, zstd,
messages of at most 1 MB). Nothing of the product is changed or switched off.

- ``run_polars_with_output``: one ``group_by`` over all rows, then the output;
- ``run_polars_per_poll``: arrowagg's shape: the messages read ``poll`` at a time, each
  poll grouped as it is read, the partial results merged once at the end;
- ``run_polars_read_ahead``: that, with the reading two polls ahead in a thread.

``bench.research.floor`` takes the floor apart (grouping alone, integer keys, the output
alone, arrowagg with its checks of untrusted bytes switched off).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import closing

import polars as pl
import pyarrow as pa
from pyarrow import ipc

from bench import kernel
from bench.payloads import WINDOW_MS, Payloads
from bench.read_ahead import read_ahead
from consumer.core.decode import poll_frame
from consumer.core.plan import AggregationPlan, derive_plan
from wire.output import OutputMessage, decode_output, encode_window

OUTPUT_MAX_BYTES = 1_000_000  # the output messages' limit in the bench's settings


def all_rows(payloads: Payloads) -> pl.DataFrame:
    """Every message read by pyarrow (no validation), as one frame without copying."""
    return poll_frame([ipc.open_stream(value).read_all() for value in payloads.values])


def plan_of(payloads: Payloads) -> AggregationPlan:
    return derive_plan(kernel.schema_of(payloads.values[0]), time_column="ts")


def _window_start() -> pl.Expr:
    return (pl.col("ts").dt.epoch("ms") // WINDOW_MS * WINDOW_MS).alias("window_start")


def grouped_at_once(frame: pl.DataFrame, plan: AggregationPlan) -> pl.DataFrame:
    """The seed's aggregates per (window, keys) in one streaming ``group_by``."""
    return frame.lazy().group_by(_window_start(), *plan.keys).agg(
        kernel.seed_aggregates(plan)).collect(engine="streaming")


def grouped_polls(polls: Iterable[Sequence[pa.Table]], plan: AggregationPlan) -> pl.DataFrame:
    """Each poll's rows grouped as it comes (one streaming ``group_by`` a poll), the
    partial results merged once at the end: the daemon's shape, without its validation,
    state, closing rules or commits. A result as ``grouped_at_once`` gives."""
    partial_exprs = kernel.seed_aggregates(plan)
    merge_exprs = [*(kernel.POLARS_FUNCS[a.func](pl.col(a.name)) for a in plan.aggregates),
                   pl.col("row_count").sum()]
    partials = [poll_frame(tables).lazy().group_by(_window_start(), *plan.keys)
                .agg(partial_exprs).collect(engine="streaming") for tables in polls]
    return pl.concat(partials).lazy().group_by("window_start", *plan.keys).agg(
        merge_exprs).collect(engine="streaming")


def read_polls(payloads: Payloads, poll: int) -> Iterator[list[pa.Table]]:
    """The messages read by pyarrow (no validation), ``poll`` at a time."""
    values = payloads.values
    for first in range(0, len(values), poll):
        yield [ipc.open_stream(value).read_all() for value in values[first:first + poll]]


def run_polars_with_output(payloads: Payloads, _poll: int) -> list[list[OutputMessage]]:
    """One ``group_by`` over all rows, every window's result encoded for the output."""
    return encoded_windows(grouped_at_once(all_rows(payloads), plan_of(payloads)))


def run_polars_per_poll(payloads: Payloads, poll: int) -> list[list[OutputMessage]]:
    """Polls of ``poll`` messages, as arrowagg's are, each grouped as it is read, then
    merged; every window encoded as arrowagg encodes its own."""
    return encoded_windows(grouped_polls(read_polls(payloads, poll), plan_of(payloads)))


def run_polars_read_ahead(payloads: Payloads, poll: int) -> list[list[OutputMessage]]:
    """``run_polars_per_poll`` with the reading in a thread of its own, two polls ahead
    of the grouping (pyarrow's reads and Polars' queries release the GIL)."""
    with closing(read_ahead(read_polls(payloads, poll))) as polls:
        return encoded_windows(grouped_polls(polls, plan_of(payloads)))


def encoded_windows(grouped: pl.DataFrame) -> list[list[OutputMessage]]:
    """A (window_start in ms, keys, aggregates, row_count) result, each window encoded as
    arrowagg encodes its own (Arrow IPC, zstd, messages of at most 1 MB)."""
    at = pl.Datetime("ms", "UTC")
    windows = grouped.select(  # arrowagg's output columns, their order and types
        pl.col("window_start").cast(at), (pl.col("window_start") + WINDOW_MS).cast(at)
        .alias("window_end"), pl.exclude("window_start", "row_count"),
        pl.col("row_count").cast(pl.Int64),
    ).partition_by("window_start")
    return [encode_window(w, start_ms=_first_ms(w, "window_start"),
                          end_ms=_first_ms(w, "window_end"),
                          input_rows=int(w.get_column("row_count").sum()), fmt="arrow",
                          compression="zstd", max_bytes=OUTPUT_MAX_BYTES)
            for w in windows]


def _first_ms(frame: pl.DataFrame, column: str) -> int:
    return int(frame.get_column(column).dt.epoch("ms").item(0))


def decoded_rows(windows: list[list[OutputMessage]]) -> pl.DataFrame:
    """The rows the encoded windows hold, read back as a subscriber reads them."""
    return pl.concat([decode_output(m.value, m.headers).frame
                      for messages in windows for m in messages])
