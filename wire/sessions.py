"""Session output as a subscriber holds it: the sessions, one row each (more for a
session that went out early in deltas), with every revision applied.

Each row of session output is a session with its own bounds, identified by its keys and
``window_start``. With ``window.late: revise`` a row also names, in ``replaces``, the
``window_start`` of the emitted sessions of its keys it replaces: a late row extended
or bridged them. docs/wire-format.md ("Session windows") gives the rule this applies:
remove the replaced sessions; then a ``delta`` row adds to the session of its keys and
``window_start`` (kept here as one more row), any other row is that session's whole
result now. A row whose session already holds one of its revision is a repeat
(at-least-once output) and is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import polars as pl

from wire.output import REPLACES_COLUMN, OutputWindow

# Sessions held to apply revisions to; past this, the earliest ending are let go (a
# revision replacing one of them then replaces nothing here).
MAX_HELD_SESSIONS = 100_000

_REVISION = "__revision"
_GONE = "__replaced_start"


@dataclass
class _Message:
    chunks: dict[int, OutputWindow] = field(default_factory=dict)


class SessionTable:
    """The sessions a subscriber holds, and each revision applied to them."""

    def __init__(self, *, max_held: int = MAX_HELD_SESSIONS) -> None:
        self._held: pl.DataFrame | None = None
        self._max_held = max_held
        self._partial: dict[tuple[int, int, str], _Message] = {}

    def add(self, message: OutputWindow) -> OutputWindow | None:
        """Take one decoded message of session output; once all chunks of its revision
        are in, apply it and return it whole, with ``replaced``: the held rows it
        replaced (and the earlier rows of sessions it gives whole again)."""
        at = (message.start_ms, message.revision, message.kind)
        collected = self._partial.setdefault(at, _Message())
        collected.chunks[message.chunk[0]] = message
        if len(collected.chunks) < message.chunk[1]:
            return None
        del self._partial[at]
        frames = [collected.chunks[i].frame for i in sorted(collected.chunks)]
        rows = pl.concat([f for f in frames if f.height] or frames[:1], how="vertical_relaxed")
        whole = replace(message, chunk=(1, 1), frame=rows)
        return replace(whole, replaced=self.apply(whole))

    def apply(self, window: OutputWindow) -> pl.DataFrame:
        """Apply one whole revision; return the rows it took out."""
        keys = list(window.keys or ())
        rows = window.frame.with_columns(pl.lit(window.revision, pl.Int64).alias(_REVISION))
        if self._held is None or self._held.height == 0:
            self._store(rows)
            return rows.clear().drop(_REVISION)
        rows = self._without_repeats(rows, keys)
        gone = self._gone(rows, keys, whole=window.kind != "delta")
        held = self._held.join(gone, on=[*keys, "window_start"], how="anti", nulls_equal=True)
        replaced = self._held.join(gone, on=[*keys, "window_start"], how="semi",
                                   nulls_equal=True)
        self._held = held
        self._store(rows)
        return replaced.drop(_REVISION)

    def _without_repeats(self, rows: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
        assert self._held is not None  # noqa: S101 - called with sessions held
        on = [*keys, "window_start", _REVISION]
        return rows.join(self._held.select(on), on=on, how="anti", nulls_equal=True,
                         maintain_order="left")

    @staticmethod
    def _gone(rows: pl.DataFrame, keys: list[str], *, whole: bool) -> pl.DataFrame:
        """(keys, window_start) of the sessions ``rows`` take out: those they replace,
        and, but for deltas, their own (a row gives its session whole)."""
        parts = []
        if REPLACES_COLUMN in rows.columns:
            named = rows.select(*keys, pl.col(REPLACES_COLUMN).alias(_GONE)).explode(_GONE)
            parts.append(named.drop_nulls(_GONE).select(
                *keys, pl.col(_GONE).cast(rows.schema["window_start"]).alias("window_start")))
        if whole:
            parts.append(rows.select(*keys, "window_start"))
        if not parts:
            return rows.select(*keys, "window_start").clear()
        return pl.concat(parts, how="vertical_relaxed").unique()

    def _store(self, rows: pl.DataFrame) -> None:
        held = rows if self._held is None else pl.concat([self._held, rows],
                                                         how="diagonal_relaxed")
        if held.height > self._max_held:
            held = held.sort("window_end").tail(self._max_held)
        self._held = held

    def sessions(self) -> pl.DataFrame:
        """Every session held, its rows as the output gave them."""
        if self._held is None:
            return pl.DataFrame()
        return self._held.drop(_REVISION)
