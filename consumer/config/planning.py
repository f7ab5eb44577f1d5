"""The aggregation plan the settings ask for, for a given input schema, and the schema
that pins it when ``aggregation.schema_from`` names one.

Without ``schema_from`` the plan is derived from the schema of the first message with
rows, whichever arrives first; with it, from that file's schema before any message is
read, the same on every instance and after every restart.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from consumer.config.checks import window_kind
from consumer.config.models import AggregationSettings, KeyPath, Problem, Settings
from consumer.core.decode import conformed_schema
from consumer.core.emit import REVISION
from consumer.core.plan import AggregationPlan, Override, PlanError, Quantile, derive_plan
from wire.errors import UsageError
from wire.files import InputFile
from wire.output import REPLACES_COLUMN

SCHEMA_FROM: KeyPath = ("aggregation", "schema_from")


def plan_for(settings: Settings, schema: pa.Schema) -> AggregationPlan:
    """The aggregation plan for ``schema`` under the configured windows and aggregation.

    Only event-time windows read ``window.timestamp_column``; other windows skip it (a
    timestamp column would otherwise become a key, a group per distinct time) unless the
    aggregation names it."""
    window, aggregation = settings.window, settings.aggregation
    event_time = window.kind != "count" and window.time == "event"
    column = window.timestamp_column
    unused = {} if event_time or column is None else {column: (
        f"window.timestamp_column, which {window_kind(window)} windows do not use (list "
        "it in aggregation.keys to group by it)")}
    overrides: dict[str, Override] = {
        name: func if isinstance(func, str) else Quantile(func.quantile)
        for name, func in aggregation.columns.items()}
    return derive_plan(schema, time_column=column if event_time else None,
                       keys=aggregation.keys, overrides=overrides, unused=unused,
                       expressions=aggregation.expressions,
                       reserved=_reserved(settings))


def _reserved(settings: Settings) -> tuple[str, ...]:
    """Result columns of the daemon's own that an input column must not be named."""
    if settings.window.late != "revise":
        return ()
    return (REVISION, REPLACES_COLUMN) if settings.window.kind == "session" else (REVISION,)


def pinned_schema(aggregation: AggregationSettings) -> pa.Schema | None:
    """The schema ``aggregation.schema_from`` pins the plan with (None: not set);
    UnreadableFileError when the file cannot be read."""
    if aggregation.schema_from is None:
        return None
    return InputFile.open(aggregation.schema_from).schema()


def pinned_origin(aggregation: AggregationSettings) -> str:
    """Where a pinned plan came from, as messages name it."""
    return f"aggregation.schema_from ({aggregation.schema_from})"


def schema_from_problems(settings: Settings) -> Iterator[Problem]:
    """``aggregation.schema_from`` must be readable and give a plan under these settings:
    found when the configuration is loaded, not at the first message."""
    try:
        schema = pinned_schema(settings.aggregation)
    except UsageError as err:  # the file's own one line names it
        yield SCHEMA_FROM, str(err)
        return
    if schema is None:
        return
    try:
        conformed_schema(plan_for(settings, schema), schema)
    except PlanError as err:
        yield SCHEMA_FROM, f"{settings.aggregation.schema_from}: {err}"
