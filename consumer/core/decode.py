"""Decode step: an input message's bytes become rows in the plan's columns, or a rejection.

The plan (``Decoder.plan``) is pinned from a schema given up front
(``aggregation.schema_from``), or else fixed by the schema of the first message with
rows. Every message must carry the plan's key and time columns, and its other columns
with the same or a safely castable type; extra columns are ignored. Anything else is
rejected with a reason that names the plan and where it came from, never a crash.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from polars.exceptions import PanicException

from consumer.core.plan import AggregationPlan, PlanError
from wire.errors import InputRejectedError
from wire.input import DecodeLimits, WireFormatError, decode_ipc_stream, parse_headers

log = logging.getLogger(__name__)

PlanFactory = Callable[[pa.Schema], AggregationPlan]
# What confluent-kafka's Message.headers() returns.
MessageHeaders = Sequence[tuple[str, str | bytes | None]] | dict[str, str | bytes | None] | None


class RejectedMessageError(InputRejectedError):
    """The message cannot be aggregated; ``reason`` is a short code for the DLQ."""


@dataclass(frozen=True)
class DecodedMessage:
    table: pa.Table  # the plan's columns only, in the plan's types
    min_event_ms: int | None  # the event-time range of its rows (None: no rows, no time)
    max_event_ms: int | None


# Where a plan derived from the data comes from, in messages that name it.
FIRST_MESSAGE = "the first message with rows"


class UnsupportedTypeError(PlanError):
    """Valid Arrow that Polars cannot aggregate (an unknown time zone, say)."""


class Decoder:
    def __init__(self, make_plan: PlanFactory, *, limits: DecodeLimits,
                 max_message_bytes: int) -> None:
        self._make_plan = make_plan
        self._limits = limits
        self._max_message_bytes = max_message_bytes
        self.plan: AggregationPlan | None = None
        self._schema: pa.Schema | None = None  # the plan's input columns and types
        self.origin: str | None = None  # where the plan came from, for the messages
        self._warned_missing: set[frozenset[str]] = set()

    def pin(self, schema: pa.Schema, origin: str) -> None:
        """Fix the plan from ``schema`` now (``aggregation.schema_from``) rather than from
        the first message with rows; ``origin`` names the schema's source. PlanError when
        no plan can be made of it."""
        self._fix_plan(schema, origin)

    def decode(self, value: bytes | None, headers: MessageHeaders,
               where: str | None = None) -> DecodedMessage:
        """One message's rows in the plan's columns; ``where`` (``topic[p]@offset``)
        names it as the plan's source when it is the first with rows."""
        if value is not None and len(value) > self._max_message_bytes:
            raise RejectedMessageError(
                "too-many-bytes", f"a message of {len(value)} bytes, more than "
                f"input.max_message_bytes ({self._max_message_bytes})")
        try:
            parse_headers(list(headers.items()) if isinstance(headers, dict) else headers)
            table = decode_ipc_stream(value, self._limits)
        except WireFormatError as err:
            raise RejectedMessageError(err.reason, err.detail) from err
        if self.plan is None or self._schema is None:
            if table.num_rows == 0:
                # A schema without rows says nothing of the data to come (a worker's
                # warm-up message, say): the plan is fixed by the first rows.
                return DecodedMessage(table, None, None)
            self._plan_from_message(table.schema, where)
        return self._conform(table)

    def time_dtype(self) -> pl.DataType | None:
        """The Polars type of the plan's event-time column (once the plan is fixed)."""
        if self.plan is None or self.plan.time_column is None or self._schema is None:
            return None
        empty = pl.DataFrame(self._schema.empty_table())
        return empty.schema[self.plan.time_column]

    def _plan_from_message(self, schema: pa.Schema, where: str | None) -> None:
        try:
            self._fix_plan(schema, f"{FIRST_MESSAGE}, {where}" if where else FIRST_MESSAGE)
        except UnsupportedTypeError as err:
            raise RejectedMessageError("unsupported-type", str(err)) from err
        except PlanError as err:
            raise RejectedMessageError("schema-mismatch", f"{err}; this first message with "
                                       "rows cannot fix the plan") from err

    def _fix_plan(self, schema: pa.Schema, origin: str) -> None:
        plan = self._make_plan(schema)
        self._schema = conformed_schema(plan, schema)
        self.plan = plan
        self.origin = origin
        for skipped in plan.skipped:
            log.info("column %r (%s) is skipped: %s", skipped.name, skipped.dtype, skipped.reason)
        log.info("aggregation plan fixed from %s:\n%s", origin, plan.describe())

    def _mismatch(self, detail: str) -> RejectedMessageError:
        """A schema-mismatch that says which plan the message was checked against."""
        pin = "" if self.origin is None or not self.origin.startswith(FIRST_MESSAGE) else (
            " (pin the plan: aggregation.schema_from)")
        return RejectedMessageError(
            "schema-mismatch", f"{detail}; checked against the plan from {self.origin}{pin}")

    def _conform(self, table: pa.Table) -> DecodedMessage:
        """Apply the schema-evolution policy (docs/reliability.md)."""
        assert self._schema is not None  # noqa: S101 - set by _fix_plan
        assert self.plan is not None  # noqa: S101
        present = set(table.schema.names)
        required = {*self.plan.keys, *([self.plan.time_column] if self.plan.time_column else [])}
        if missing := [n for n in self._schema.names if n in required and n not in present]:
            raise self._mismatch(f"missing key/time columns {missing}")
        if present.issuperset(self._schema.names):
            table = table.select(self._schema.names)  # zero-copy; the usual case
        else:
            self._warn_missing([n for n in self._schema.names if n not in present])
            columns = [
                table.column(f.name) if f.name in present else pa.nulls(table.num_rows, f.type)
                for f in self._schema
            ]  # a missing aggregate column counts as all null
            table = pa.Table.from_arrays(columns, names=self._schema.names)
        if not table.schema.equals(self._schema):
            table = self._cast(table)
        return DecodedMessage(table, *self._event_range(table))

    def _warn_missing(self, missing: list[str]) -> None:
        """Once per set of missing aggregate columns: their sums, minima and maxima go on
        over the messages that still carry them, which an operator must know."""
        if frozenset(missing) in self._warned_missing:
            return
        self._warned_missing.add(frozenset(missing))
        log.warning("messages without aggregate column(s) %s: counted as null there "
                    "(docs/reliability.md, schema evolution)", missing)

    def _cast(self, table: pa.Table) -> pa.Table:
        assert self._schema is not None  # noqa: S101
        for got, want in zip(table.schema, self._schema, strict=True):
            if pa.types.is_null(got.type):
                continue  # an all-null column (e.g. empty, untyped) fits any type
            if got.type != want.type and _family(got.type) != _family(want.type):
                raise self._mismatch(
                    f"column {got.name!r} is {got.type}, the plan has {want.type}; only "
                    "numeric widening and string/timestamp variants cast")
        try:
            return table.cast(self._schema, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
            detail = " ".join(str(err).split())[:200]
            raise self._mismatch(f"values do not fit the plan's types: {detail}") from err

    def _event_range(self, table: pa.Table) -> tuple[int | None, int | None]:
        """The smallest and largest event time in epoch milliseconds (floored)."""
        assert self.plan is not None  # noqa: S101
        name = self.plan.time_column
        if name is None or table.num_rows == 0:
            return None, None
        column = table.column(name)
        if column.null_count:
            raise RejectedMessageError(
                "null-event-time", f"{column.null_count} rows have no {name!r}")
        try:
            extremes = pc.min_max(column.cast(pa.int64()))
            low, high = int(extremes["min"].as_py()), int(extremes["max"].as_py())
        except pa.ArrowInvalid as err:
            raise RejectedMessageError(
                "invalid-event-time", f"{name!r} does not fit epoch milliseconds: {err}") from err
        if not pa.types.is_timestamp(column.type):
            return low, high  # integer epoch milliseconds
        per_ms = {"s": None, "ms": 1, "us": 1_000, "ns": 1_000_000}[column.type.unit]
        if per_ms is None:
            return low * 1_000, high * 1_000
        return low // per_ms, high // per_ms


def conformed_schema(plan: AggregationPlan, schema: pa.Schema) -> pa.Schema:
    """The columns ``plan`` reads from ``schema``, in the types the daemon holds them
    (numeric aggregates widened to 64 bits); UnsupportedTypeError when Polars cannot
    take them."""
    aggregated = {a.name for a in plan.aggregates} | (
        set(plan.buffered_columns) - {*plan.keys, plan.time_column})
    conformed = pa.schema([
        _widened(schema.field(name)) if name in aggregated else schema.field(name)
        for name in plan.input_columns
    ])
    try:  # valid Arrow that Polars refuses (an unknown time zone, say) is refused here
        pl.DataFrame(conformed.empty_table())
    except (pl.exceptions.PolarsError, PanicException, ValueError, TypeError) as err:
        raise UnsupportedTypeError(f"the schema cannot be aggregated: {err}") from err
    return conformed


def poll_frame(tables: Sequence[pa.Table]) -> pl.DataFrame:
    """One Polars frame of decoded messages' tables (same schema), without copying rows.

    Plain string columns become string views in Arrow first: Polars holds strings as
    views, and pyarrow's cast (short strings inlined, long ones pointing into the
    message's buffer) is several times faster than ``pl.from_arrow``'s own conversion.
    """
    table = pa.concat_tables(tables)
    for index, field in enumerate(table.schema):
        if pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            viewed = table.column(index).cast(pa.string_view())
            table = table.set_column(index, field.with_type(pa.string_view()), viewed)
    frame = pl.from_arrow(table, rechunk=False)
    assert isinstance(frame, pl.DataFrame)  # noqa: S101 - a Table gives a frame
    return frame


def _widened(field: pa.Field) -> pa.Field:
    """Numeric aggregate columns are held as 64-bit, so a producer widening int32 to
    int64 (or float32 to float64) later is not a schema change."""
    kind = field.type
    if pa.types.is_signed_integer(kind):
        return field.with_type(pa.int64())
    if pa.types.is_unsigned_integer(kind):
        return field.with_type(pa.uint64())
    if pa.types.is_floating(kind):
        return field.with_type(pa.float64())
    if pa.types.is_decimal128(kind):  # the precision may grow; the scale is the unit
        return field.with_type(pa.decimal128(38, kind.scale))
    return field


def _family(kind: pa.DataType) -> str:
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return "numeric"
    if pa.types.is_decimal128(kind):
        return "decimal"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return "string"
    if pa.types.is_dictionary(kind):
        return "string" if _family(kind.value_type) == "string" else str(kind)
    if pa.types.is_timestamp(kind):
        return "timestamp"
    return str(kind)
