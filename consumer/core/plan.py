"""The aggregation plan: which columns group, which aggregate and how, which are skipped.

The default rules are those of DataFusion's ``build_sql_query`` example, which this
project generalises: string and timestamp columns are group keys; numeric columns are
summed, except that a name ending in ``_min`` or ``_max`` takes the minimum or maximum;
every other type is skipped. The event-time column becomes the window, never a key.
Configuration may name the keys explicitly and override any column's function.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

import pyarrow as pa

from wire.errors import UsageError

AggFunc = Literal["sum", "min", "max", "count", "mean", "first", "last"]
AGG_FUNCS: tuple[AggFunc, ...] = get_args(AggFunc)

# The result frame's own columns; a user column of the same name would be overwritten.
RESERVED_NAMES = frozenset({"window_start", "window_end", "row_count", "__rows"})

_SUFFIX_RULES: tuple[tuple[str, AggFunc], ...] = (
    ("_sum", "sum"), ("_count", "sum"), ("_min", "min"), ("_max", "max"),
)


class PlanError(UsageError):
    """A schema or configuration the plan cannot honour; ``str()`` is one line."""


@dataclass(frozen=True)
class ColumnAgg:
    name: str
    func: AggFunc


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
    reasons: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)

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
            f"  {agg.name!r}: {agg.func} -- {why.get(agg.name, 'configured')}"
            for agg in self.aggregates
        ]
        if self.skipped:
            lines.append(f"skipped ({len(self.skipped)}):")
            lines += [f"  {s.name!r}: {s.reason}" for s in self.skipped]
        return "\n".join(lines)


def derive_plan(
    schema: pa.Schema,
    *,
    time_column: str | None = None,
    keys: Sequence[str] | None = None,
    overrides: Mapping[str, AggFunc] | None = None,
    unused: Mapping[str, str] | None = None,
) -> AggregationPlan:
    """Derive the plan for ``schema``; raise PlanError naming the offending column.

    ``unused`` maps columns to skip, unless configured as a key or an aggregate, to the
    reason (e.g. the timestamp column of windows that do not use event time).
    """
    fields = {f.name: f for f in schema}
    if len(fields) != len(schema):
        raise PlanError(f"the schema has duplicate column names: {schema.names}")
    if time_column is not None:
        _check_time_column(fields, time_column)
    chosen_keys = _explicit_keys(fields, keys, time_column) if keys is not None else None
    overrides = dict(overrides or {})
    _check_overrides(fields, overrides, time_column, chosen_keys, set(unused or ()))

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
        if f.name in skip:
            skipped.append(SkippedColumn(f.name, str(f.type), skip[f.name]))
            continue
        placed = _place(f, chosen_keys, overrides)
        if isinstance(placed, SkippedColumn):
            skipped.append(placed)
            continue
        func, reasons[f.name] = placed
        if func is None:
            key_list.append(f.name)
        else:
            aggregates.append(ColumnAgg(f.name, func))

    # Configured keys keep their configured order; default keys follow the schema.
    final_keys = tuple(chosen_keys if chosen_keys is not None else key_list)
    _check_reserved([*final_keys, *(a.name for a in aggregates)])
    if not final_keys and not aggregates:
        raise PlanError(
            "no column to group by or aggregate: the schema has no string, timestamp or "
            "numeric column besides the time column (configure aggregation.columns)"
        )
    return AggregationPlan(
        keys=final_keys,
        aggregates=tuple(aggregates),
        skipped=tuple(skipped),
        time_column=time_column,
        reasons=tuple(reasons.items()),
    )


def _place(
    f: pa.Field, chosen_keys: Sequence[str] | None, overrides: Mapping[str, AggFunc]
) -> tuple[AggFunc | None, str] | SkippedColumn:
    """A column's function (None for a key) and the rule behind it, or why it is skipped."""
    if chosen_keys is not None and f.name in chosen_keys:
        return None, f"{f.type}, listed in aggregation.keys"
    if f.name in overrides:
        return overrides[f.name], f"{f.type}, configured in aggregation.columns"
    if chosen_keys is None and _is_default_key(f.type):
        return None, f"{f.type}, {_kind(f.type)} columns are group keys"
    if is_numeric(f.type):
        return _numeric_rule(f.name, f.type)
    return SkippedColumn(f.name, str(f.type), _skip_reason(f.type, chosen_keys))


def is_numeric(dtype: pa.DataType) -> bool:
    return bool(pa.types.is_integer(dtype) or pa.types.is_floating(dtype))


def is_string(dtype: pa.DataType) -> bool:
    """utf8, large_utf8, string_view, or a dictionary whose values are any of these."""
    if pa.types.is_dictionary(dtype):
        return is_string(dtype.value_type)
    return bool(
        pa.types.is_string(dtype)
        or pa.types.is_large_string(dtype)
        or pa.types.is_string_view(dtype)
    )


def _is_orderable(dtype: pa.DataType) -> bool:
    temporal = (
        pa.types.is_timestamp(dtype) or pa.types.is_date(dtype)
        or pa.types.is_time(dtype) or pa.types.is_duration(dtype)
    )
    return bool(is_numeric(dtype) or is_string(dtype) or temporal)


def _is_default_key(dtype: pa.DataType) -> bool:
    return bool(is_string(dtype) or pa.types.is_timestamp(dtype))


def _kind(dtype: pa.DataType) -> str:
    return "string" if is_string(dtype) else "timestamp"


def _numeric_rule(name: str, dtype: pa.DataType) -> tuple[AggFunc, str]:
    for suffix, func in _SUFFIX_RULES:
        if name.endswith(suffix):
            return func, f"{dtype}, numeric and the name ends in {suffix}"
    return "sum", f"{dtype}, numeric columns without a _min/_max suffix are summed"


def _skip_reason(dtype: pa.DataType, chosen_keys: Sequence[str] | None) -> str:
    if chosen_keys is not None and _is_default_key(dtype):
        return (
            f"{_kind(dtype)} column ({dtype}) not among the configured keys "
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
    overrides: Mapping[str, AggFunc],
    time_column: str | None,
    chosen_keys: Sequence[str] | None,
    unused: set[str],
) -> None:
    for name, func in overrides.items():
        if name not in fields:
            raise PlanError(f"aggregation for {name!r}: no such column ({list(fields)})")
        if func not in AGG_FUNCS:
            raise PlanError(f"aggregation for {name!r}: unknown function {func!r} ({AGG_FUNCS})")
        if name == time_column:
            raise PlanError(f"aggregation for {name!r}: it is the time column, not an aggregate")
        dtype = fields[name].type
        is_key = (name in chosen_keys if chosen_keys is not None
                  else _is_default_key(dtype) and name not in unused)
        if is_key:
            raise PlanError(
                f"aggregation for {name!r}: it is a group key (list the keys explicitly "
                "in aggregation.keys to aggregate it instead)"
            )
        _check_func_fits(name, func, dtype)


def _check_func_fits(name: str, func: AggFunc, dtype: pa.DataType) -> None:
    if func in ("sum", "mean") and not is_numeric(dtype):
        raise PlanError(f"aggregation for {name!r}: {func} needs a numeric column, not {dtype}")
    if func in ("min", "max") and not _is_orderable(dtype):
        raise PlanError(
            f"aggregation for {name!r}: {func} needs a numeric, temporal or string "
            f"column, not {dtype}"
        )


def _check_reserved(names: Sequence[str]) -> None:
    for name in names:
        if name in RESERVED_NAMES:
            raise PlanError(
                f"column {name!r} clashes with a result column of the same name; "
                "rename it in the producer"
            )
