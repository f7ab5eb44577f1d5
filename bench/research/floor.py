"""The Polars floor taken apart: how far each of the kernel's gaps can close, and why.

``bench.polars_floor`` is the floor ``make bench`` times (Polars doing arrowagg's whole
job); this times it beside DataFusion and arrowagg in one process, repetitions
interleaved, with runs that each leave out more of what arrowagg must do:

- ``polars_from_bytes``: pyarrow reads each message (no validation), one frame without
  copying, the window column and the kernel's aggregates in **one** streaming
  ``group_by`` over all rows: what a fluent Polars user writes for a batch job; no output;
- ``polars_with_output``, ``polars_per_poll``, ``polars_read_ahead``: the whole-job
  shapes of ``bench.polars_floor`` (the fastest is the floor);
- ``arrowagg_unchecked``: arrowagg with ``wire.input``'s checks of untrusted bytes
  switched off (declared sizes, schema text, full validation) by patching them: an
  experiment that prices them, never a setting, hence here and not in ``make bench``;
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

    python -m bench.research floor            # the full kernel cases
    python -m bench.research floor --smoke
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any
from unittest import mock

import polars as pl

from bench import kernel
from bench.payloads import WINDOW_MS, Payloads
from bench.polars_floor import (
    OUTPUT_MAX_BYTES,
    all_rows,
    decoded_rows,
    grouped_at_once,
    plan_of,
    run_polars_per_poll,
    run_polars_read_ahead,
    run_polars_with_output,
)
from bench.research import cases
from consumer.core.types import ClosedWindow
from wire import input as wire_input
from wire.output import encode_window


def _packed_key(frame: pl.DataFrame, payloads: Payloads) -> pl.Expr:
    """One Int64 per (window, keys): the window index above each key's stable id.

    Dictionary keys arrive as categoricals whose physical ids are stable across
    messages; plain keys are cast to categoricals of their own first. The bit widths come
    from the data, so the packing is one-to-one (checked: at most 63 bits)."""
    categories = pl.Categorical(pl.Categories("bench.research.floor.keys"))
    ids = [(pl.col(k) if isinstance(frame.schema[k], pl.Categorical) else
            pl.col(k).cast(categories)).to_physical().cast(pl.Int64)
           for k in plan_of(payloads).keys]
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
    return grouped_at_once(all_rows(payloads), plan_of(payloads))


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


def measure(built: Payloads, *, repetitions: int, poll_messages: int) -> dict[str, Any]:
    """Median seconds of arrowagg, DataFusion and the Polars floor stages, interleaved."""
    frame = all_rows(built)
    key = _packed_key(frame, built)
    keyed = frame.with_columns(key)
    aggregates = kernel.seed_aggregates(plan_of(built))
    windows = kernel.arrowagg_windows(built, poll_messages)
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
        "polars_group_by": lambda: grouped_at_once(frame, plan_of(built)),
        "int_key_in_query": lambda: _int_key_group_by(frame.lazy(), key, aggregates),
        "int_key_group_by": lambda: _int_key_group_by(keyed.lazy(), "key", aggregates),
        "output": lambda: [_encode(w) for w in windows],
    }
    seconds = kernel.interleaved_seconds(runners, repetitions)
    medians = {name: statistics.median(runs) for name, runs in seconds.items()}
    return {"case": built.case.name, "encoding": built.encoding, "rows": built.rows,
            "median_s": medians, "seconds": seconds}


def _check_int_key(grouped: pl.DataFrame, reference: pl.DataFrame) -> None:
    """The integer key makes arrowagg's groups: as many, with the same row counts."""
    got = grouped.get_column("row_count").sort().to_list()
    want = reference.get_column("row_count").sort().to_list()
    if got != want:
        raise AssertionError(f"the packed key gives {len(got)} groups, arrowagg {len(want)}")


def _encode(window: ClosedWindow) -> Any:
    return encode_window(window.frame, start_ms=window.start_ms, end_ms=window.end_ms,
                         input_rows=window.input_rows, fmt="arrow", compression="zstd",
                         max_bytes=OUTPUT_MAX_BYTES)


def main(argv: Sequence[str] | None = None) -> int:
    args = cases.parser("floor", __doc__).parse_args(argv)
    for built, poll in cases.kernel_payloads(smoke=args.smoke):
        medians = measure(built, repetitions=built.case.repetitions,
                          poll_messages=poll)["median_s"]
        datafusion, naive = medians["datafusion"], medians["polars_naive"]
        print(f"{built.case.name}, {built.encoding}: " + ", ".join(
            f"{name} {s:.3f} s ({datafusion / s:.2f}x DataFusion, {naive / s:.2f}x naive)"
            for name, s in medians.items()), flush=True)
    return 0

