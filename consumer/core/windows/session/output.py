"""What sessions become when they go out: closed windows, each row a session with its
own bounds (docs/wire-format.md, "Session windows").

The sessions going out in one turn share a message per revision number and kind: a
session going out once, whole, is ``full``; an early revision (the memory budget) and
the revisions after it are ``delta`` (rows to add up); a provisional one (early results,
provisional.py) is ``update``, not final; with ``window.late: revise``, a
session that replaces emitted ones (a late row extended or bridged them) is ``update``,
and every row says which emitted sessions of its keys it replaces (``replaces``: their
``window_start``s), whatever its kind.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from consumer.core.aggregate import PartialAggregator
from consumer.core.types import ROW_COUNT, ROWS, WINDOW_END, WINDOW_START, ClosedWindow
from consumer.core.windows.session.spans import (
    EARLY_REVISIONS,
    END,
    FIRST,
    NEXT_REVISION,
    REPLACES,
    SID,
)
from consumer.core.windows.session.values import SessionValues
from wire.output import REPLACES_COLUMN, RevisionKind

_UTC_MS = pl.Datetime("ms", "UTC")
_KIND = "__session_kind"


class SessionOutput:
    def __init__(self, aggregator: PartialAggregator, keys: Sequence[str],
                 values: SessionValues | None, *, revising: bool) -> None:
        """``revising``: rows say which emitted sessions they replace (late: revise)."""
        self._aggregator = aggregator
        self._keys = list(keys)
        self._values = values
        self._revising = revising

    def windows(self, sessions: pl.DataFrame, *, final: bool,
                provisional: bool = False) -> list[ClosedWindow]:
        """The output of ``sessions``: one ClosedWindow per revision number and kind
        among them, each row with its own session's bounds. Sessions that hold no rows
        (an early revision emptied them) give none. ``provisional``: open sessions as
        they stand, whole (early results, provisional.py): kind ``update``, not final."""
        sessions = sessions.filter(pl.col(ROWS) > 0) if sessions.height else sessions
        if sessions.height == 0:
            return []
        delta = pl.lit(value=not final) | (pl.col(EARLY_REVISIONS) > 0)
        kind = pl.when(pl.lit(value=provisional)).then(pl.lit("update")).when(delta).then(
            pl.lit("delta")).when(pl.col(REPLACES).list.len() > 0).then(
            pl.lit("update")).otherwise(pl.lit("full"))
        out = []
        parts = sessions.with_columns(kind.alias(_KIND)).sort(FIRST).partition_by(
            NEXT_REVISION, _KIND, as_dict=True, maintain_order=True)
        for (revision, kind_name), part in parts.items():
            frame = self._frame(part)
            out.append(ClosedWindow(
                int(part.get_column(FIRST).min()),  # type: ignore[arg-type]
                int(part.get_column(END).max()),  # type: ignore[arg-type]
                frame, int(frame.get_column(ROW_COUNT).sum()), final=final,
                revision=int(revision), kind=_kind(str(kind_name))))
        return out

    def _frame(self, part: pl.DataFrame) -> pl.DataFrame:
        finalized = self._aggregator.finalize(part.select(self._aggregator.state_schema.names()))
        if self._values is not None:
            finalized = self._values.buffer.attach(
                finalized, self._values.of(part.get_column(SID)))
        bounds = part.select(pl.col(FIRST).cast(_UTC_MS).alias(WINDOW_START),
                             pl.col(END).cast(_UTC_MS).alias(WINDOW_END), *self._keys)
        columns = [bounds, finalized.drop(SID)]
        if self._revising:
            columns.append(part.select(pl.col(REPLACES).cast(pl.List(_UTC_MS))
                                       .alias(REPLACES_COLUMN)))
        return pl.concat(columns, how="horizontal")


def _kind(name: str) -> RevisionKind:
    if name == "update":
        return "update"
    return "delta" if name == "delta" else "full"
