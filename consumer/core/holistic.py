"""Aggregates that do not decompose: computed at close from the window's buffered values.

``median``, ``quantile`` and ``n_unique`` (and every user expression) cannot be merged from
partial results of a window's batches, so the store keeps the rows they read: for each
poll, the group-by columns and only the columns these aggregates need
(``AggregationPlan.buffered_columns``), per window. At close they are grouped once by
(window, keys) and aggregated with Polars, and joined to the decomposable results.
Memory is O(rows) in those columns for the open windows (and the retained ones, with
``late: revise``): ``buffered_values`` counts them for the memory budget.

Semantics are SQL's, as for the other aggregates: ``quantile`` interpolates linearly
between the two nearest values (DuckDB's ``quantile_cont``, SQL's ``percentile_cont``;
``median`` is its q = 0.5); ``n_unique`` counts distinct non-null values
(``count(DISTINCT x)``); all ignore nulls, and a group with no non-null value gives null
(``n_unique``: 0). User expressions are Polars' own semantics.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from consumer.core.plan import AggregationPlan, ColumnAgg
from consumer.core.types import ROW_COUNT


class ValueBuffer:
    """The buffered columns of one plan and grouping, and the aggregates over them."""

    def __init__(self, plan: AggregationPlan, group_by: Sequence[str]) -> None:
        self._group_by = tuple(group_by)
        self.columns = tuple(c for c in plan.buffered_columns if c not in self._group_by)
        self._exprs = [_holistic_expr(a) for a in plan.aggregates if a.holistic]
        self._exprs += [e.expression.build().alias(e.name) for e in plan.expressions]
        self._order = [*self._group_by, *(a.name for a in plan.aggregates),
                       *(e.name for e in plan.expressions), ROW_COUNT]
        self._distinct_only = not plan.expressions and all(
            a.func == "n_unique" for a in plan.aggregates if a.holistic)

    @classmethod
    def for_plan(cls, plan: AggregationPlan, group_by: Sequence[str]) -> ValueBuffer | None:
        """A buffer when the plan has aggregates that need one, else None."""
        if not plan.buffered_columns:
            return None
        return cls(plan, group_by)

    def take(self, rows: pl.LazyFrame) -> pl.DataFrame:
        """What to keep of a batch that carries the group-by columns."""
        return rows.select(*self._group_by, *self.columns).collect(engine="in-memory")

    def export(self, frames: Sequence[pl.DataFrame]) -> pl.DataFrame | None:
        """One window's buffered rows as another instance can read them (None: none):
        keys as text (each instance fixes its own categorical encoding). When every
        buffered aggregate is ``n_unique``, each distinct row once: all a distinct count
        needs."""
        if not frames:
            return None
        values = pl.concat(frames, how="vertical_relaxed")
        text = [pl.col(c).cast(pl.String) for c, t in values.schema.items()
                if isinstance(t, pl.Categorical | pl.Enum)]
        values = values.with_columns(text) if text else values
        return values.unique(maintain_order=True) if self._distinct_only else values

    def count(self, frames: Sequence[pl.DataFrame]) -> int:
        """Values held in ``frames``, for the memory budget: rows times buffered columns
        (at least one, for expressions that read only keys)."""
        return sum(f.height for f in frames) * max(1, len(self.columns))

    def attach(self, finalized: pl.DataFrame, frames: Sequence[pl.DataFrame]) -> pl.DataFrame:
        """``finalized`` (group-by columns, the decomposable results, ``row_count``) with
        the buffered aggregates of the same groups joined in, in plan order."""
        if not frames:  # no rows, no groups: nothing to join
            nulls = [pl.lit(None).alias(name) for name in self._order
                     if name not in finalized.columns]
            return finalized.with_columns(nulls).select(self._order)
        values = pl.concat(frames, how="vertical_relaxed")
        results = values.lazy().group_by(*self._group_by).agg(self._exprs)
        keys = [pl.col(k).cast(finalized.schema[k]) for k in self._group_by]
        joined = finalized.lazy().join(results.with_columns(keys), on=list(self._group_by),
                                       how="left", nulls_equal=True, maintain_order="left")
        return joined.select(self._order).collect(engine="in-memory")



def _holistic_expr(agg: ColumnAgg) -> pl.Expr:
    col = pl.col(agg.name)
    match agg.func:
        case "median":
            expr = col.median()
        case "quantile":
            assert agg.q is not None  # noqa: S101 - the plan sets q for every quantile
            expr = col.quantile(agg.q, interpolation="linear")
        case "n_unique":
            expr = col.drop_nulls().n_unique().cast(pl.Int64)
        case _:
            raise ValueError(f"{agg.func} decomposes; it is no buffered aggregate")
    return expr.alias(agg.name)
