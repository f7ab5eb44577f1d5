"""Incremental aggregation: partial states per batch, merged, then finalized.

Only the aggregates that decompose are here; those that need the window's values
(``median``, ``quantile``, ``n_unique``, user expressions) are consumer/core/holistic.py's.

Each batch is pre-aggregated into a small state frame; states merge associatively, so a
window's result does not depend on how its rows were split into batches. The semantics
are SQL's (DuckDB, DataFusion): aggregates ignore nulls, the sum or mean of no non-null
value is null, count counts non-null values, null keys form their own group, and
first/last take the first/last value (null or not) in arrival order.

Arrival order survives because Polars keeps row order within each group (documented for
``group_by``; the tests check it through a streaming merge too) and ``pl.concat`` keeps
the order of its inputs: a merged state's ``first`` is the first partial's first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import polars as pl

from consumer.core.keys import StateKeys
from consumer.core.plan import AggFunc, AggregationPlan
from consumer.core.types import ROW_COUNT, ROWS

# Engine choice, measured on 2 cores. partial() of a batch whose window column is computed
# inside the query (Mrows/s over 3.2M rows of the kernel's 10k-group data, in-memory vs
# streaming): 100k-row batches 23 vs 22, 200k 21 vs 23, 400k 24 vs 34, 800k 26 vs 42.
# merge() of 10k state rows 1.1 vs 1.7 ms, 80k 8.3 vs 6.1, 300k 60 vs 23, 1M 208 vs 62.
# partial() learns the batch's height from a cheap count and streams from the
# break-even; merge() streams from this many state rows.
_STREAMING_MERGE_FROM_ROWS = 50_000
_STREAMING_PARTIAL_FROM_ROWS = 200_000
# Like DataFusion's skip_partial_aggregation_probe_ratio_threshold: a batch whose state
# keeps more than this share of its rows is not worth grouping; the next batches go to
# merge() ungrouped, then a batch is grouped again to probe whether that still holds.
_SKIP_WHEN_STATE_RATIO = 0.6
_SKIP_PROBE_MIN_ROWS = 50_000
_SKIP_BATCHES = 8

_Part = Literal["sum", "n", "min", "max", "count", "first", "last"]
_COUNTS: tuple[_Part, ...] = ("n", "count")

# Which state parts each function keeps; sum and mean also count non-null inputs so an
# all-null group finalizes to null rather than Polars' 0.
_PARTS: dict[AggFunc, tuple[_Part, ...]] = {  # the decomposable functions
    "sum": ("sum", "n"),
    "mean": ("sum", "n"),
    "min": ("min",),
    "max": ("max",),
    "count": ("count",),
    "first": ("first",),
    "last": ("last",),
}


@dataclass(frozen=True)
class _StatePart:
    column: str  # the input column it summarises
    part: _Part
    name: str  # its column in the state frame


class PartialAggregator:
    """Aggregates batches into mergeable states for one plan and one grouping."""

    def __init__(self, plan: AggregationPlan, group_by: Sequence[str]) -> None:
        """``group_by`` is the full grouping, e.g. ``("window_start", *plan.keys)``."""
        self._plan = plan
        self._group_by = tuple(group_by)
        _check_names(self._group_by, plan)
        prefix = _state_prefix(self._group_by)
        self._decomposable = [agg for agg in plan.aggregates if not agg.holistic]
        self._parts = [
            [_StatePart(agg.name, part, f"{prefix}{i}_{part}") for part in _PARTS[agg.func]]
            for i, agg in enumerate(self._decomposable)
        ]
        # Count parts (a sum's or mean's ``n``, a ``count``) are stored only once their
        # column has had a null: until then each equals ``__rows`` and is taken from it.
        # At 1M groups they were 4 of a state row's 16 columns.
        self._stored_counts: set[str] = set()
        self._keys = StateKeys(self._group_by)
        # first/last depend on arrival order; keep their batches on the in-memory engine.
        self._order_free = all(p.part not in ("first", "last") for p in self._all_parts())
        self._state_schema: pl.Schema | None = None
        self._skip_batches = 0
        # False when the last partial() passed its rows on ungrouped (one state row per
        # input row): such a state may hold a group more than once until merged.
        self.last_partial_grouped = True

    def _all_parts(self) -> list[_StatePart]:
        return [p for parts in self._parts for p in parts]

    @property
    def group_by(self) -> tuple[str, ...]:
        return self._group_by

    @property
    def order_free(self) -> bool:
        """Whether merged states are the same in any order of their parts (no first/last)."""
        return self._order_free

    @property
    def plan(self) -> AggregationPlan:
        return self._plan

    @property
    def state_schema(self) -> pl.Schema:
        """The schema of the states made now; known once a first batch has been through
        partial(). It gains a count column when that column first has a null; merge()
        takes older states, without it, as they are."""
        if self._state_schema is None:
            raise RuntimeError("the state schema is known only after a first partial()")
        return self._state_schema

    def partial(self, frame: pl.LazyFrame) -> pl.DataFrame:
        """Pre-aggregate one batch that already carries the group_by columns.

        When batches barely shrink (nearly as many groups as rows), the next ones are
        not grouped at all: each row becomes its own state row, and merge() does the
        grouping once. The result is the same; the wasted hashing is not.
        """
        height, nulls = self._profile(frame)
        self._stored_counts |= {p.name for p in self._all_parts()
                                if p.part in _COUNTS and nulls[p.column] > 0}
        if self._skip_batches > 0:
            self._skip_batches -= 1
            self.last_partial_grouped = False
            return self._keep(self._row_states(frame))
        self.last_partial_grouped = True
        schema = frame.collect_schema()
        exprs = [_partial_expr(p, schema[p.column]) for p in self._stored_parts()]
        counted = pl.len().cast(pl.Int64).alias(ROWS)
        # The batch is not materialised first: its window column (or any other derived
        # column) is computed inside the grouping query, morsel by morsel.
        query = self._aggregate(frame, [*exprs, counted])
        query = query.with_columns(self._keys.casts(schema))  # string keys to ids
        streaming = height >= _STREAMING_PARTIAL_FROM_ROWS and self._order_free
        state = query.collect(engine="streaming" if streaming else "in-memory")
        if (self._group_by and self._order_free and height >= _SKIP_PROBE_MIN_ROWS
                and state.height > _SKIP_WHEN_STATE_RATIO * height):
            self._skip_batches = _SKIP_BATCHES
        return self._keep(state)

    def _stored_parts(self) -> list[_StatePart]:
        """The parts a state frame holds now, in state column order."""
        return [p for p in self._all_parts()
                if p.part not in _COUNTS or p.name in self._stored_counts]

    def _state_columns(self) -> list[str]:
        return [*self._group_by, *(p.name for p in self._stored_parts()), ROWS]

    def _profile(self, frame: pl.LazyFrame) -> tuple[int, dict[str, int]]:
        """The batch's row count and each aggregated column's null count; only the input
        columns are read (Arrow keeps null counts, so this costs next to nothing)."""
        columns = list(dict.fromkeys(p.column for p in self._all_parts()))
        stats = frame.select(
            pl.len().alias("rows"),
            *(pl.col(c).null_count().alias(f"nulls{i}") for i, c in enumerate(columns)),
        ).collect(engine="in-memory")
        nulls = {c: int(stats.item(0, f"nulls{i}")) for i, c in enumerate(columns)}
        return int(stats.item(0, "rows")), nulls

    def _keep(self, state: pl.DataFrame) -> pl.DataFrame:
        state = self._keys.encode(state)
        self._state_schema = state.schema  # the layout grows when a count starts to be stored
        return state

    def _row_states(self, rows: pl.LazyFrame) -> pl.DataFrame:
        """Each row as a one-row state: what partial() gives a batch of distinct groups."""
        schema = rows.collect_schema()
        exprs = []
        for p in self._stored_parts():
            col = pl.col(p.column)
            if p.part == "sum":
                exprs.append(col.cast(_sum_dtype(p.column, schema[p.column])).alias(p.name))
            elif p.part in _COUNTS:
                exprs.append(col.is_not_null().cast(pl.Int64).alias(p.name))
            else:
                exprs.append(col.alias(p.name))
        states = rows.select(*self._group_by, *exprs, pl.lit(1, pl.Int64).alias(ROWS))
        return states.with_columns(self._keys.casts(schema)).collect(engine="in-memory")

    def merge(self, states: Sequence[pl.DataFrame], *, regroup: bool = False) -> pl.DataFrame:
        """Merge states, given in arrival order, into one state of the same schema.

        A single state is returned as it is, unless ``regroup``: then it may be an
        ungrouped one (see ``last_partial_grouped``) and is grouped like several would be.
        """
        if not states:
            return self.state_schema.to_frame()
        if len(states) == 1 and not regroup and self._has_layout(states[0]):
            return states[0]
        exprs = [_merge_expr(p) for p in self._stored_parts()]
        merged = pl.concat([self._relaid(s) for s in states], how="vertical")
        query = self._aggregate(merged, [*exprs, pl.col(ROWS).sum()])
        streaming = sum(s.height for s in states) >= _STREAMING_MERGE_FROM_ROWS
        return query.collect(engine="streaming" if streaming else "in-memory")

    def _has_layout(self, state: pl.DataFrame) -> bool:
        return state.columns == self._state_columns()

    def _relaid(self, state: pl.DataFrame) -> pl.LazyFrame:
        """``state`` in the current layout: a count stored since it was made equals its
        ``__rows`` (its column had no null until then)."""
        if self._has_layout(state):
            return state.lazy()
        missing = [pl.col(ROWS).alias(name) for name in self._stored_counts
                   if name not in state.columns]
        return state.lazy().with_columns(missing).select(self._state_columns())

    def finalize(self, state: pl.DataFrame) -> pl.DataFrame:
        """The result: group_by columns, each decomposable aggregate under its input name
        (in plan order), then ``row_count`` (Int64)."""
        results = [
            _finalize_expr(agg.func, parts, state.columns).alias(agg.name)
            for agg, parts in zip(self._decomposable, self._parts, strict=True)
        ]
        return state.select(
            *self._keys.decoded(), *results, pl.col(ROWS).cast(pl.Int64).alias(ROW_COUNT)
        )

    def export_state(self, state: pl.DataFrame) -> pl.DataFrame:
        """``state`` in the form another aggregator of the same plan can take in
        (``import_state``): every state column present (a count this one does not store
        equals ``__rows``) and string keys as strings, not this aggregator's ids."""
        full = [*self._group_by, *(p.name for p in self._all_parts()), ROWS]
        counts = [pl.col(ROWS).alias(p.name) for p in self._all_parts()
                  if p.part in _COUNTS and p.name not in state.columns]
        return state.with_columns(counts).select(full).with_columns(self._keys.decoded())

    def group_keys(self, state: pl.DataFrame) -> pl.DataFrame:
        """The group-by columns of ``state`` (made by this aggregator), decoded."""
        return state.select(self._keys.decoded())

    def import_state(self, state: pl.DataFrame) -> pl.DataFrame:
        """An exported state (maybe another instance's), ready to merge with this one's:
        its keys as this aggregator's ids, and every count stored from now on (the
        exported state carries them all)."""
        self._stored_counts |= {p.name for p in self._all_parts() if p.part in _COUNTS}
        counts = [pl.col(ROWS).alias(p.name) for p in self._all_parts()
                  if p.part in _COUNTS and p.name not in state.columns]
        return self._keep(state.with_columns(counts).select(self._state_columns()))

    def compact_keys(self, states: Sequence[pl.DataFrame]) -> list[pl.DataFrame] | None:
        """``states`` (every live state frame) re-keyed when the ids handed out for string
        keys far outnumber their rows, else None: see ``consumer.core.keys``."""
        if not self._keys.renewal_due(sum(s.height for s in states)):
            return None
        return self._keys.renew(states)

    def _aggregate(self, frame: pl.LazyFrame, exprs: list[pl.Expr]) -> pl.LazyFrame:
        if self._group_by:
            return frame.group_by(*self._group_by).agg(exprs)
        # Without keys a select gives one row even for no input; a state row must mean
        # "some rows arrived", or an empty batch would feed nulls into first/last.
        return frame.select(exprs).filter(pl.col(ROWS) > 0)


def _partial_expr(p: _StatePart, dtype: pl.DataType) -> pl.Expr:
    col = pl.col(p.column)
    match p.part:
        case "sum":
            expr = col.cast(_sum_dtype(p.column, dtype)).sum()
        case "n" | "count":
            expr = col.count().cast(pl.Int64)
        case "min":
            expr = col.min()
        case "max":
            expr = col.max()
        case "first":
            expr = col.first()
        case "last":
            expr = col.last()
    return expr.alias(p.name)


def _merge_expr(p: _StatePart) -> pl.Expr:
    col = pl.col(p.name)
    match p.part:
        case "sum" | "n" | "count":
            return col.sum()
        case "min":
            return col.min()
        case "max":
            return col.max()
        case "first":
            return col.first()
        case "last":
            return col.last()


def _finalize_expr(func: AggFunc, parts: list[_StatePart], columns: list[str]) -> pl.Expr:
    # A count that is not stored equals the group's row count.
    state = {p.part: pl.col(p.name if p.name in columns else ROWS) for p in parts}
    if func == "sum":
        return pl.when(state["n"] > 0).then(state["sum"])
    if func == "mean":
        return pl.when(state["n"] > 0).then(state["sum"].cast(pl.Float64) / state["n"])
    (only,) = state.values()
    return only


def _sum_dtype(column: str, dtype: pl.DataType) -> pl.DataType:
    # Widen before summing: Polars sums UInt32 as UInt32 and Float32 as Float32. An Int64
    # sum that overflows wraps (Polars' behaviour; DuckDB would widen to HUGEINT).
    if dtype.is_signed_integer():
        return pl.Int64()
    if dtype.is_unsigned_integer():
        return pl.UInt64()
    if dtype.is_float():
        return pl.Float64()
    if isinstance(dtype, pl.Decimal):  # exact, as SQL sums DECIMAL(p, s) to DECIMAL(38, s)
        return pl.Decimal(38, dtype.scale)
    raise TypeError(f"column {column!r} has type {dtype}; sum and mean need a numeric column")


def _check_names(group_by: tuple[str, ...], plan: AggregationPlan) -> None:
    outputs = [*group_by, *(agg.name for agg in plan.aggregates),
               *(e.name for e in plan.expressions), ROW_COUNT]
    duplicates = sorted({name for name in outputs if outputs.count(name) > 1})
    if duplicates:
        raise ValueError(f"columns {duplicates} would appear twice in the result")
    if ROWS in group_by:
        raise ValueError(f"group-by column {ROWS!r} clashes with the row-count state column")


def _state_prefix(group_by: tuple[str, ...]) -> str:
    # State columns sit beside the group-by columns; lengthen the prefix until no group-by
    # name could be mistaken for a state column.
    prefix = "__s"
    while any(name.startswith(prefix) for name in group_by):
        prefix = "_" + prefix
    return prefix
