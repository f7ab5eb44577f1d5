"""The floor under the kernel targets: Polars at its best on the kernel's payloads.

Targets that stay unmet need the experiment that shows why: the same engine at its best
on the same data, timed beside DataFusion (and arrowagg) in one process, repetitions
interleaved. Each stage below leaves out more of what arrowagg must do:

- ``polars_from_bytes``: pyarrow reads each message (no validation), one frame without
  copying (``consumer.core.decode.poll_frame``: ``pl.from_arrow(..., rechunk=False)``,
  plain strings cast to string views by pyarrow first), the window column and the kernel's
  aggregates in **one** streaming ``group_by`` over all rows: what a fluent Polars user
  writes for a batch job; no output;
- ``polars_with_output``: that run, and each window's result then encoded as arrowagg
  encodes its own (``wire.output.encode_window``): the floor of any Polars pipeline that
  reads the same bytes and writes the same output, measured whole rather than summed
  from its parts;
- ``polars_per_poll``: the same job in arrowagg's shape: the messages read ``poll`` at a
  time, each poll grouped as it is read, the partial results merged once at the end,
  every window encoded. At 10k groups with dictionary keys this is often the fastest
  shape (a poll's rows group in less memory); at 1M groups it is the slowest (every poll
  has nearly as many groups as rows);
- ``polars_read_ahead``: ``polars_per_poll`` with the reading in a thread of its own,
  two polls ahead of the grouping;
- ``arrowagg_unchecked``: arrowagg with ``wire.input``'s checks of untrusted bytes
  switched off (declared sizes, schema text, full validation): an experiment that prices
  them, never a setting;
- ``polars_naive``: the kernel's naive Polars peer, so the target stated against it
  ("3x naive Polars") has its floor in the same run;
- ``polars_group_by``: that ``group_by`` alone, over the frame built before the clock
  starts: the engine's grouping floor on this data;
- ``int_key_in_query``: the same groups on **one** Int64 key (window index and the keys'
  stable ids packed into its bits), the key computed inside the streaming query;
- ``int_key_group_by``: that key built before the clock, the ``group_by`` alone: what
  Polars takes when all it groups on is one integer (issue 15's "Polars' own
  integer-key speed");
- ``output``: ``wire.output.encode_window`` of arrowagg's own result windows alone
  (Arrow IPC, zstd, 1 MB messages), which no peer does.

    python -m bench.floor            # the full kernel cases
    python -m bench.floor --smoke
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, closing, contextmanager
from typing import Any
from unittest import mock

import polars as pl
import pyarrow as pa
from pyarrow import ipc

from bench import kernel, payloads
from bench.payloads import WINDOW_MS, Payloads
from bench.read_ahead import read_ahead
from bench.sizes import FULL, SMOKE
from consumer.core.decode import poll_frame
from consumer.core.plan import AggregationPlan, derive_plan
from consumer.core.types import ClosedWindow
from wire import input as wire_input
from wire.output import OutputMessage, decode_output, encode_window

_MAX_BYTES = 1_000_000  # the output messages' limit in the bench's settings


def _frame(payloads: Payloads) -> pl.DataFrame:
    return poll_frame([ipc.open_stream(value).read_all() for value in payloads.values])


def _plan(payloads: Payloads) -> AggregationPlan:
    return derive_plan(kernel.schema_of(payloads.values[0]), time_column="ts")


def _group_by(frame: pl.DataFrame, payloads: Payloads) -> pl.DataFrame:
    """The seed's aggregates per (window, keys)."""
    plan = _plan(payloads)
    window = (pl.col("ts").dt.epoch("ms") // WINDOW_MS * WINDOW_MS).alias("window_start")
    return frame.lazy().group_by(window, *plan.keys).agg(kernel.seed_aggregates(plan)).collect(
        engine="streaming")


def _packed_key(frame: pl.DataFrame, payloads: Payloads) -> pl.Expr:
    """One Int64 per (window, keys): the window index above each key's stable id.

    Dictionary keys arrive as categoricals whose physical ids are stable across
    messages; plain keys are cast to categoricals of their own first. The bit widths come
    from the data, so the packing is one-to-one (checked: at most 63 bits)."""
    categories = pl.Categorical(pl.Categories("bench.floor.keys"))
    ids = [(pl.col(k) if isinstance(frame.schema[k], pl.Categorical) else
            pl.col(k).cast(categories)).to_physical().cast(pl.Int64)
           for k in _plan(payloads).keys]
    window = pl.col("ts").dt.epoch("ms") // WINDOW_MS
    first, last, *tops = frame.select(window.min(), window.max().alias("last"),
                                      *(i.max().alias(f"k{n}") for n, i in enumerate(ids))).row(0)
    widths = [int(top).bit_length() for top in (last - first, *tops)]
    if sum(widths) > 63:
        raise ValueError(f"the key needs {sum(widths)} bits; the floor packs into 63")
    key = window - int(first)
    for width, one in zip(widths[1:], ids, strict=True):
        key = key * (1 << width) + one
    return key.alias("key")


def _int_key_group_by(frame: pl.LazyFrame, key: pl.Expr | str,
                      aggregates: list[pl.Expr]) -> pl.DataFrame:
    return frame.group_by(key).agg(aggregates).collect(engine="streaming")


def run_polars_from_bytes(payloads: Payloads, _poll: int) -> pl.DataFrame:
    return _group_by(_frame(payloads), payloads)


def grouped_polls(polls: Iterable[Sequence[pa.Table]], plan: AggregationPlan) -> pl.DataFrame:
    """Each poll's rows grouped as it comes (one streaming ``group_by`` a poll), the
    partial results merged once at the end: the daemon's shape, without its validation,
    state, closing rules or commits. A result as ``run_polars_from_bytes`` gives."""
    window = (pl.col("ts").dt.epoch("ms") // WINDOW_MS * WINDOW_MS).alias("window_start")
    partial_exprs = kernel.seed_aggregates(plan)
    merge_exprs = [*(kernel.POLARS_FUNCS[a.func](pl.col(a.name)) for a in plan.aggregates),
                   pl.col("row_count").sum()]
    partials = [poll_frame(tables).lazy().group_by(window, *plan.keys).agg(partial_exprs)
                .collect(engine="streaming") for tables in polls]
    return pl.concat(partials).lazy().group_by("window_start", *plan.keys).agg(
        merge_exprs).collect(engine="streaming")


def _read_polls(payloads: Payloads, poll: int) -> Iterator[list[pa.Table]]:
    """The messages read by pyarrow (no validation), ``poll`` at a time."""
    values = payloads.values
    for first in range(0, len(values), poll):
        yield [ipc.open_stream(value).read_all() for value in values[first:first + poll]]


def run_polars_per_poll(payloads: Payloads, poll: int) -> list[list[OutputMessage]]:
    """Polls of ``poll`` messages, as arrowagg's are, each grouped as it is read, then
    merged; every window encoded as arrowagg encodes its own."""
    return encoded_windows(grouped_polls(_read_polls(payloads, poll), _plan(payloads)))


@contextmanager
def input_unchecked() -> Iterator[None]:
    """While open, ``wire.input`` reads messages without checking them."""
    with ExitStack() as patches:
        for check in ("validate_batch", "_check_declared_sizes", "_check_schema"):
            patches.enter_context(mock.patch.object(wire_input, check, _unchecked))
        yield


def _unchecked(*_args: object) -> None:
    return None


def run_arrowagg_unchecked(payloads: Payloads, poll: int) -> pl.DataFrame:
    with input_unchecked():
        return kernel.run_arrowagg(payloads, poll)


def run_polars_read_ahead(payloads: Payloads, poll: int) -> list[list[OutputMessage]]:
    """``run_polars_per_poll`` with the reading in a thread of its own, two polls ahead
    of the grouping (pyarrow's reads and Polars' queries release the GIL)."""
    with closing(read_ahead(_read_polls(payloads, poll))) as polls:
        return encoded_windows(grouped_polls(polls, _plan(payloads)))


def run_polars_with_output(payloads: Payloads, _poll: int) -> list[list[OutputMessage]]:
    """``run_polars_from_bytes`` and every window's result encoded for the output topic."""
    return encoded_windows(run_polars_from_bytes(payloads, _poll))


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
                          compression="zstd", max_bytes=_MAX_BYTES)
            for w in windows]


def measure(built: Payloads, *, repetitions: int, poll_messages: int) -> dict[str, Any]:
    """Median seconds of arrowagg, DataFusion and the Polars floor stages, interleaved."""
    frame = _frame(built)
    key = _packed_key(frame, built)
    keyed = frame.with_columns(key)
    aggregates = kernel.seed_aggregates(_plan(built))
    windows = _windows(built, poll_messages)
    reference = kernel.run_arrowagg(built, poll_messages)
    kernel.check_agreement({
        "arrowagg": reference,
        "polars_from_bytes": run_polars_from_bytes(built, poll_messages),
        "polars_with_output": decoded_rows(run_polars_with_output(built, poll_messages)),
        "polars_per_poll": decoded_rows(run_polars_per_poll(built, poll_messages)),
        "polars_read_ahead": decoded_rows(run_polars_read_ahead(built, poll_messages)),
        "polars_naive": kernel.run_polars_naive(built, poll_messages),
        "arrowagg_unchecked": run_arrowagg_unchecked(built, poll_messages)})
    _check_int_key(_int_key_group_by(keyed.lazy(), "key", aggregates), reference)
    runners: dict[str, Callable[[], Any]] = {
        "arrowagg": lambda: kernel.run_arrowagg(built, poll_messages),
        "arrowagg_unchecked": lambda: run_arrowagg_unchecked(built, poll_messages),
        "datafusion": lambda: kernel.run_datafusion(built, poll_messages),
        "polars_from_bytes": lambda: run_polars_from_bytes(built, poll_messages),
        "polars_with_output": lambda: run_polars_with_output(built, poll_messages),
        "polars_per_poll": lambda: run_polars_per_poll(built, poll_messages),
        "polars_read_ahead": lambda: run_polars_read_ahead(built, poll_messages),
        "polars_naive": lambda: kernel.run_polars_naive(built, poll_messages),
        "polars_group_by": lambda: _group_by(frame, built),
        "int_key_in_query": lambda: _int_key_group_by(frame.lazy(), key, aggregates),
        "int_key_group_by": lambda: _int_key_group_by(keyed.lazy(), "key", aggregates),
        "output": lambda: [_encode(w) for w in windows],
    }
    seconds = kernel.interleaved_seconds(runners, repetitions)
    medians = {name: statistics.median(runs) for name, runs in seconds.items()}
    return {"case": built.case.name, "encoding": built.encoding, "rows": built.rows,
            "median_s": medians, "seconds": seconds}


def _first_ms(frame: pl.DataFrame, column: str) -> int:
    return int(frame.get_column(column).dt.epoch("ms").item(0))


def decoded_rows(windows: list[list[OutputMessage]]) -> pl.DataFrame:
    """The rows the encoded windows hold, read back as a subscriber reads them."""
    return pl.concat([decode_output(m.value, m.headers).frame
                      for messages in windows for m in messages])


def _check_int_key(grouped: pl.DataFrame, reference: pl.DataFrame) -> None:
    """The integer key makes arrowagg's groups: as many, with the same row counts."""
    got = grouped.get_column("row_count").sort().to_list()
    want = reference.get_column("row_count").sort().to_list()
    if got != want:
        raise AssertionError(f"the packed key gives {len(got)} groups, arrowagg {len(want)}")


def _windows(built: Payloads, poll_messages: int) -> list[ClosedWindow]:
    """arrowagg's result windows, as its pipeline closes them."""
    return kernel.arrowagg_windows(built, poll_messages)


def _encode(window: ClosedWindow) -> Any:
    return encode_window(window.frame, start_ms=window.start_ms, end_ms=window.end_ms,
                         input_rows=window.input_rows, fmt="arrow", compression="zstd",
                         max_bytes=_MAX_BYTES)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    sizes = SMOKE if args.smoke else FULL
    for case in sizes.kernel_cases:
        for encoding in payloads.ENCODINGS:
            figures = measure(payloads.build(case, encoding), repetitions=case.repetitions,
                              poll_messages=sizes.poll_messages)
            medians = figures["median_s"]
            datafusion, naive = medians["datafusion"], medians["polars_naive"]
            print(f"{case.name}, {encoding}: " + ", ".join(
                f"{name} {s:.3f} s ({datafusion / s:.2f}x DataFusion, {naive / s:.2f}x naive)"
                for name, s in medians.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
