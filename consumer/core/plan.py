"""The aggregation plan: which columns group, which aggregate and how, which are skipped.

The default rules are those of DataFusion's ``build_sql_query`` example, which this
project generalises: string and timestamp columns are group keys; numeric columns are
summed, except that a name ending in ``_min`` or ``_max`` takes the minimum or maximum;
every other type is skipped (consumer/core/column_types.py says which type is which).
The event-time column becomes the window, never a key. Configuration may name the keys
explicitly and override any column's function, and add expressions of its own
(consumer/core/expressions.py).

Most functions decompose: a window's result merges from partial results of its batches
(consumer/core/aggregate.py). ``median``, ``quantile`` and ``n_unique``, and every user
expression, do not: they need the window's values, which are buffered per window
(consumer/core/holistic.py); ``describe`` says which and why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

import polars as pl
import pyarrow as pa

from consumer.core.column_types import is_default_key, is_numeric, is_orderable, key_kind
from consumer.core.expressions import ExpressionError, ParsedExpression, parse_expression
from wire.errors import UsageError

AggFunc = Literal["sum", "min", "max", "count", "mean", "first", "last", "median", "quantile",
                  "n_unique"]
AGG_FUNCS: tuple[AggFunc, ...] = get_args(AggFunc)
# Functions that do not decompose into mergeable partial results, and why.
HOLISTIC: dict[AggFunc, str] = {
    "median": "a median cannot be merged from the medians of parts",
    "quantile": "a quantile cannot be merged from the quantiles of parts",
    "n_unique": "distinct counts of parts do not add up (a value can be in several)",
}

# The result frame's own columns; a user column of the same name would be overwritten.
RESERVED_NAMES = frozenset({"window_start", "window_end", "row_count", "__rows"})

_SUFFIX_RULES: tuple[tuple[str, AggFunc], ...] = (
    ("_sum", "sum"), ("_count", "sum"), ("_min", "min"), ("_max", "max"),
)


class PlanError(UsageError):
    """A schema or configuration the plan cannot honour; ``str()`` is one line."""


@dataclass(frozen=True)
class Quantile:
    """The configured function ``{quantile: q}``: the q-quantile, interpolated linearly
    (SQL's ``quantile_cont`` / ``percentile_cont``)."""

    q: float


# What aggregation.columns gives a column: a function, or a quantile with its q.
Override = AggFunc | Quantile


@dataclass(frozen=True)
class ColumnAgg:
    name: str
    func: AggFunc
    q: float | None = None  # quantile only

    @property
    def label(self) -> str:
        return f"quantile({self.q:g})" if self.func == "quantile" else self.func

    @property
    def holistic(self) -> bool:
        return self.func in HOLISTIC


@dataclass(frozen=True)
class ExpressionAgg:
    """A user expression (aggregation.expressions): its output column and parsed form."""

    name: str
    expression: ParsedExpression


@dataclass(frozen=True)
class SkippedColumn:
    name: str
    dtype: str
    reason: str


@dataclass(frozen=True)
class AggregationPlan:
    """How one schema is aggregated per window.

    ``keys`` are in schema order (or the configured order), ``aggregates`` in schema
    order. ``reasons`` maps a key or aggregate column to the rule that put it there; it
    only feeds ``describe`` and takes no part in equality.
    """

    keys: tuple[str, ...]
    aggregates: tuple[ColumnAgg, ...]
    skipped: tuple[SkippedColumn, ...]
    time_column: str | None
    expressions: tuple[ExpressionAgg, ...] = ()
    reasons: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)

    @property
    def buffered_columns(self) -> tuple[str, ...]:
        """The input columns whose values are buffered per window: those of holistic
        functions and of expressions (empty when every aggregate decomposes)."""
        names = [a.name for a in self.aggregates if a.holistic]
        names += [c for e in self.expressions for c in e.expression.columns]
        return tuple(dict.fromkeys(names))

    @property
    def input_columns(self) -> tuple[str, ...]:
        """Every input column the plan reads: keys, time, aggregated and buffered."""
        time = (self.time_column,) if self.time_column else ()
        names = [*self.keys, *time, *(a.name for a in self.aggregates),
                 *self.buffered_columns]
        return tuple(dict.fromkeys(names))

    def describe(self) -> str:
        """Human text for ``consumer explain``: every column, what happens to it and why."""
        why = dict(self.reasons)
        lines = []
        if self.time_column is not None:
            kind = why.get(self.time_column, "")
            lines.append(f"time column: {self.time_column!r} ({kind}{'; ' if kind else ''}"
                         "assigns windows; never a key)")
        no_keys = "keys: none (one group per window)"
        lines.append(f"keys ({len(self.keys)}):" if self.keys else no_keys)
        lines += [f"  {name!r}: {why.get(name, 'configured key')}" for name in self.keys]
        lines.append(f"aggregates ({len(self.aggregates)}):")
        lines += [
            f"  {agg.name!r}: {agg.label} -- {why.get(agg.name, 'configured')}"
            + (f"; buffers the window's values ({HOLISTIC[agg.func]})" if agg.holistic else "")
            for agg in self.aggregates
        ]
        if self.expressions:
            lines.append(f"expressions ({len(self.expressions)}):")
            lines += [
                f"  {e.name!r}: {e.expression.text} -- buffers the window's values of "
                f"{', '.join(map(repr, e.expression.columns))} (an expression runs over "
                f"each (window, keys) group's rows){e.expression.caveat}"
                for e in self.expressions
            ]
        if buffered := self.buffered_columns:
            lines.append(f"buffered per window: {', '.join(map(repr, buffered))} (counted "
                         "against input.max_buffered_values); every other aggregate "
                         "merges partial results")
        else:
            lines.append("buffered per window: nothing (every aggregate merges partial "
                         "results)")
        if self.skipped:
            lines.append(f"skipped ({len(self.skipped)}):")
            lines += [f"  {s.name!r}: {s.reason}" for s in self.skipped]
        return "\n".join(lines)


def derive_plan(
    schema: pa.Schema,
    *,
    time_column: str | None = None,
    keys: Sequence[str] | None = None,
    overrides: Mapping[str, Override] | None = None,
    unused: Mapping[str, str] | None = None,
    expressions: Mapping[str, str] | None = None,
    reserved: Sequence[str] = (),
) -> AggregationPlan:
    """Derive the plan for ``schema``; raise PlanError naming the offending column.

    ``unused`` maps columns to skip, unless configured as a key or an aggregate, to the
    reason (e.g. the timestamp column of windows that do not use event time).
    ``expressions`` maps output columns to user expressions (consumer/core/expressions.py).
    ``reserved``: result columns the output adds besides ``RESERVED_NAMES``.
    """
    fields = {f.name: f for f in schema}
    if len(fields) != len(schema):
        raise PlanError(f"the schema has duplicate column names: {schema.names}")
    if time_column is not None:
        _check_time_column(fields, time_column)
    chosen_keys = _explicit_keys(fields, keys, time_column) if keys is not None else None
    overrides = dict(overrides or {})
    _check_overrides(fields, overrides, time_column, chosen_keys, set(unused or ()))
    parsed = _parsed_expressions(fields, expressions or {})
    read = {c for e in parsed for c in e.expression.columns}

    key_list: list[str] = []
    aggregates: list[ColumnAgg] = []
    skipped: list[SkippedColumn] = []
    reasons: dict[str, str] = {}
    if time_column is not None:
        reasons[time_column] = _time_reason(fields[time_column].type)
    skip = {name: why for name, why in (unused or {}).items()
            if name not in (chosen_keys or ()) and name not in overrides}
    for f in schema:
        if f.name == time_column:
            continue
        placed = (SkippedColumn(f.name, str(f.type), skip[f.name]) if f.name in skip
                  else _place(f, chosen_keys, overrides))
        if isinstance(placed, SkippedColumn):
            if f.name in read:
                reasons[f.name] = f"{f.type}, read by aggregation.expressions only"
            else:
                skipped.append(placed)
            continue
        func, reasons[f.name] = placed
        if func is None:
            key_list.append(f.name)
        elif isinstance(func, Quantile):
            aggregates.append(ColumnAgg(f.name, "quantile", func.q))
        else:
            aggregates.append(ColumnAgg(f.name, func))

    # Configured keys keep their configured order; default keys follow the schema.
    final_keys = tuple(chosen_keys if chosen_keys is not None else key_list)
    taken = [*final_keys, *(a.name for a in aggregates)]
    _check_reserved(taken, reserved)
    _check_expression_names(parsed, [*taken, *reserved])
    if not final_keys and not aggregates and not parsed:
        raise PlanError(
            "no column to group by or aggregate: the schema has no string, timestamp or "
            "numeric column besides the time column (configure aggregation.columns)"
        )
    return AggregationPlan(
        keys=final_keys,
        aggregates=tuple(aggregates),
        skipped=tuple(skipped),
        time_column=time_column,
        expressions=tuple(parsed),
        reasons=tuple(reasons.items()),
    )


def _place(
    f: pa.Field, chosen_keys: Sequence[str] | None, overrides: Mapping[str, Override]
) -> tuple[Override | None, str] | SkippedColumn:
    """A column's function (None for a key) and the rule behind it, or why it is skipped."""
    if chosen_keys is not None and f.name in chosen_keys:
        return None, f"{f.type}, listed in aggregation.keys"
    if f.name in overrides:
        return overrides[f.name], f"{f.type}, configured in aggregation.columns"
    if chosen_keys is None and is_default_key(f.type):
        return None, f"{f.type}, {key_kind(f.type)} columns are group keys"
    if is_numeric(f.type):
        return _numeric_rule(f.name, f.type)
    return SkippedColumn(f.name, str(f.type), _skip_reason(f.type, chosen_keys))


def _numeric_rule(name: str, dtype: pa.DataType) -> tuple[AggFunc, str]:
    for suffix, func in _SUFFIX_RULES:
        if name.endswith(suffix):
            return func, f"{dtype}, numeric and the name ends in {suffix}"
    return "sum", f"{dtype}, numeric columns without a _min/_max suffix are summed"


def _skip_reason(dtype: pa.DataType, chosen_keys: Sequence[str] | None) -> str:
    if chosen_keys is not None and is_default_key(dtype):
        return (
            f"{key_kind(dtype)} column ({dtype}) not among the configured keys "
            "(add it to aggregation.keys, or give it first/last/min/max/count)"
        )
    return f"type {dtype} has no default aggregation (give it one in aggregation.columns)"


def _time_reason(dtype: pa.DataType) -> str:
    if pa.types.is_integer(dtype):
        return f"{dtype}, read as epoch milliseconds"
    return str(dtype)


def _check_time_column(fields: Mapping[str, pa.Field], time_column: str) -> None:
    if time_column not in fields:
        raise PlanError(f"time column {time_column!r} is not in the schema ({list(fields)})")
    dtype = fields[time_column].type
    if not (pa.types.is_timestamp(dtype) or pa.types.is_integer(dtype)):
        raise PlanError(
            f"time column {time_column!r} has type {dtype}; it must be a timestamp "
            "or an integer of epoch milliseconds"
        )


def _explicit_keys(
    fields: Mapping[str, pa.Field], keys: Sequence[str], time_column: str | None
) -> list[str]:
    if isinstance(keys, str):
        raise PlanError(f"keys must be a list of column names, not the string {keys!r}")
    seen: list[str] = []
    for key in keys:
        if key not in fields:
            raise PlanError(f"key column {key!r} is not in the schema ({list(fields)})")
        if key == time_column:
            raise PlanError(f"key column {key!r} is the time column, which becomes the window")
        if key in seen:
            raise PlanError(f"key column {key!r} is listed twice")
        seen.append(key)
    return seen


def _check_overrides(
    fields: Mapping[str, pa.Field],
    overrides: Mapping[str, Override],
    time_column: str | None,
    chosen_keys: Sequence[str] | None,
    unused: set[str],
) -> None:
    for name, override in overrides.items():
        if name not in fields:
            raise PlanError(f"aggregation for {name!r}: no such column ({list(fields)})")
        if isinstance(override, Quantile):
            if not 0 <= override.q <= 1:
                raise PlanError(f"aggregation for {name!r}: quantile {override.q} is not "
                                "between 0 and 1")
            func: AggFunc = "quantile"
        elif override not in AGG_FUNCS or override == "quantile":
            raise PlanError(f"aggregation for {name!r}: unknown function {override!r} "
                            f"({', '.join(f for f in AGG_FUNCS if f != 'quantile')}, or "
                            "{quantile: q})")
        else:
            func = override
        if name == time_column:
            raise PlanError(f"aggregation for {name!r}: it is the time column, not an aggregate")
        dtype = fields[name].type
        is_key = (name in chosen_keys if chosen_keys is not None
                  else is_default_key(dtype) and name not in unused)
        if is_key:
            raise PlanError(
                f"aggregation for {name!r}: it is a group key (list the keys explicitly "
                "in aggregation.keys to aggregate it instead)"
            )
        _check_func_fits(name, func, dtype)


def _check_func_fits(name: str, func: AggFunc, dtype: pa.DataType) -> None:
    if func in ("sum", "mean", "median", "quantile") and not is_numeric(dtype):
        raise PlanError(f"aggregation for {name!r}: {func} needs a numeric column, not {dtype}")
    if func in ("min", "max") and not is_orderable(dtype):
        raise PlanError(
            f"aggregation for {name!r}: {func} needs a numeric, temporal or string "
            f"column, not {dtype}"
        )


def _check_reserved(names: Sequence[str], reserved: Sequence[str]) -> None:
    for name in names:
        if name in RESERVED_NAMES or name in reserved:
            raise PlanError(
                f"column {name!r} clashes with a result column of the same name; "
                "rename it in the producer"
            )


def _parsed_expressions(fields: Mapping[str, pa.Field],
                        expressions: Mapping[str, str]) -> list[ExpressionAgg]:
    parsed = []
    for name, text in expressions.items():
        try:
            expression = parse_expression(text)
        except ExpressionError as err:
            raise PlanError(f"aggregation.expressions.{name}: {err}") from None
        if missing := [c for c in expression.columns if c not in fields]:
            raise PlanError(f"aggregation.expressions.{name}: no column {missing[0]!r} in "
                            f"the schema ({list(fields)})")
        _dry_run(name, expression, [fields[c] for c in expression.columns])
        parsed.append(ExpressionAgg(name, expression))
    return parsed


def _dry_run(name: str, expression: ParsedExpression, read: Sequence[pa.Field]) -> None:
    """Evaluate the expression over one group of one all-null row of its columns, so a
    type it cannot take (the mean of a string, say) is found now, not per window."""
    rows = pa.table({f.name: pa.nulls(1, f.type) for f in read})
    try:
        frame = pl.DataFrame(rows)
        result = frame.group_by(pl.lit(0).alias("__group")).agg(expression.build().alias(name))
    except (pl.exceptions.PolarsError, TypeError, ValueError) as err:
        detail = " ".join(str(err).split())[:200]
        raise PlanError(f"aggregation.expressions.{name}: {detail}") from None
    dtype = result.schema[name]
    if isinstance(dtype, pl.List | pl.Array | pl.Struct | pl.Object):
        raise PlanError(f"aggregation.expressions.{name}: it gives a {dtype} per group, "
                        "not a value")


def _check_expression_names(parsed: Sequence[ExpressionAgg], taken: Sequence[str]) -> None:
    for agg in parsed:
        if agg.name in RESERVED_NAMES or agg.name in taken:
            raise PlanError(f"aggregation.expressions.{agg.name}: the result already has a "
                            f"column {agg.name!r}; name the expression otherwise")
