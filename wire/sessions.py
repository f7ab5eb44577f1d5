"""Session output as a subscriber holds it: the sessions, one row each (more for a
session that went out early in deltas), with every revision applied.

Each row of session output is a session with its own bounds, identified by its keys and
``window_start``. A row also names, in ``replaces``, the ``window_start`` of the emitted
sessions of its keys it replaces: a late row extended or bridged them (``window.late:
revise``), or a session that went out early moved its start or merged. docs/wire-format.md
("Session windows") gives the rule this applies: of the replaced sessions, remove those
a ``full`` or ``update`` row gave (the row holds their rows) and move those ``delta``
rows gave to the row's ``window_start`` (their rows are not in it); then a ``delta`` row
adds to the session of its keys and ``window_start`` (kept here as one more row), any
other row is that session's whole result now, but for what ``delta`` rows hold of it
(after a restart the daemon may no longer know of a session's early revisions, and sends
the rest of it whole). A row whose session already holds one of its revision and kind is
a repeat (at-least-once output) and is skipped.

Provisional rows (early results, ``window.emit_every_ms``: ``final: false``, kind
``update``) are open sessions as they stood: a later row of the same keys supersedes
every provisional row whose ``window_start`` lies within its ``[window_start,
window_end)``, as a session that grew or merged covers the starts it went out under
before. ``wire.complete.WindowAssembler`` (whole sessions only) leaves them out.

With the scale-out, each part's sessions go out in batches, each closed by a frontier
marker that counts its messages (docs/wire-format.md): ``SessionBatches`` holds a batch
until the marker and all of its messages are in, then applies it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import polars as pl

from wire.output import REPLACES_COLUMN, FrontierMarker, OutputWindow

# Sessions held to apply revisions to; past this, the earliest ending are let go (a
# revision replacing one of them then replaces nothing here).
MAX_HELD_SESSIONS = 100_000

_REVISION = "__revision"
_KIND = "__kind"
_GONE = "__replaced_start"
_INTO = "__replacing_start"
_PROVISIONAL = "__provisional"
_FROM = "__superseding_start"
_TO = "__superseding_end"


@dataclass
class _Message:
    chunks: dict[int, OutputWindow] = field(default_factory=dict)


class SessionTable:
    """The sessions a subscriber holds, and each revision applied to them."""

    def __init__(self, *, max_held: int = MAX_HELD_SESSIONS) -> None:
        self._held: pl.DataFrame | None = None
        self._max_held = max_held
        self._partial: dict[tuple[int, int, int, str], _Message] = {}

    def add(self, message: OutputWindow) -> OutputWindow | None:
        """Take one decoded message of session output; once all chunks of its revision
        are in, apply it and return it whole, with ``replaced``: the held rows it
        replaced (and the earlier rows of sessions it gives whole again)."""
        # Two parts (scale-out) may send messages alike but for their part, in chunks
        # that arrive interleaved (provisional ones: no frontier batch holds them).
        part = 0 if message.part is None else message.part[0]
        at = (part, message.start_ms, message.revision, message.kind)
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
        """Apply one whole revision; return the rows it took out (those it moved to its
        own sessions' starts too, as they stood)."""
        keys = list(window.keys or ())
        provisional = not window.final and window.kind == "update"
        rows = window.frame.with_columns(pl.lit(window.revision, pl.Int64).alias(_REVISION),
                                         pl.lit(window.kind).alias(_KIND),
                                         pl.lit(provisional).alias(_PROVISIONAL))
        if self._held is None or self._held.height == 0:
            self._store(rows)
            return rows.clear().drop(_REVISION, _KIND, _PROVISIONAL)
        on = [*keys, "window_start"]
        rows = rows.join(self._held.select(*on, _REVISION, _KIND), on=[*on, _REVISION, _KIND],
                         how="anti", nulls_equal=True, maintain_order="left")  # repeats
        replaced = self._held.join(self._replaced(rows, keys), on=on, nulls_equal=True)
        from_deltas = pl.col(_KIND) == "delta"
        moved = replaced.filter(from_deltas & (pl.col("window_start") != pl.col(_INTO)))
        gone = pl.concat([replaced.filter(~from_deltas).drop(_INTO),
                          self._superseded(rows, keys)]).unique()
        if window.kind != "delta":  # whole: it replaces its own session, bar the deltas
            gone = pl.concat([gone, self._held.filter(pl.col(_KIND) != "delta").join(
                rows.select(on), on=on, how="semi", nulls_equal=True)]).unique()
        taken_out = pl.concat([gone, moved.drop(_INTO)])
        self._held = self._held.join(taken_out.select(*on, _REVISION, _KIND),
                                     on=[*on, _REVISION, _KIND], how="anti", nulls_equal=True)
        # Deltas' rows are in no later row: they add up under the start of the row that
        # took their session in.
        self._store(moved.with_columns(pl.col(_INTO).alias("window_start")).drop(_INTO))
        self._store(rows)
        return taken_out.drop(_REVISION, _KIND, _PROVISIONAL)

    def _superseded(self, rows: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
        """The held provisional rows of ``rows``' keys that start within their bounds."""
        assert self._held is not None  # noqa: S101 - called with sessions held
        provisional = self._held.filter(pl.col(_PROVISIONAL))
        spans = rows.select(*keys, pl.col("window_start").alias(_FROM),
                            pl.col("window_end").alias(_TO))
        joined = provisional.join(spans, on=keys, nulls_equal=True) if keys else \
            provisional.join(spans, how="cross")
        within = (pl.col("window_start") >= pl.col(_FROM)) & (pl.col("window_start") < pl.col(_TO))
        return joined.filter(within).select(provisional.columns)

    @staticmethod
    def _replaced(rows: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
        """(keys, window_start) of the sessions ``rows`` name as replaced, and ``_INTO``:
        the ``window_start`` of the row naming each."""
        if REPLACES_COLUMN not in rows.columns:
            return rows.select(*keys, "window_start", pl.col("window_start").alias(_INTO)).clear()
        named = rows.select(*keys, pl.col("window_start").alias(_INTO),
                            pl.col(REPLACES_COLUMN).alias(_GONE)).explode(_GONE)
        return named.drop_nulls(_GONE).select(
            *keys, pl.col(_GONE).cast(rows.schema["window_start"]).alias("window_start"),
            _INTO)

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
        return self._held.drop(_REVISION, _KIND, _PROVISIONAL)


@dataclass
class _Batch:
    messages: list[OutputWindow] = field(default_factory=list)
    marker: FrontierMarker | None = None


class SessionBatches:
    """The scale-out's session output: each part's batches, applied to ``table`` once
    whole; ``through()`` says through where every part's sessions are in."""

    def __init__(self, table: SessionTable) -> None:
        self._table = table
        self._batches: dict[tuple[int, int], _Batch] = {}
        self._through: dict[int, int] = {}  # part -> its latest whole batch's frontier
        self._parts: int | None = None

    def add(self, message: OutputWindow | FrontierMarker) -> OutputWindow | None:
        """Take a message of a batch, or its marker; once the batch is whole, apply it
        and return its sessions as one message (None: it held none)."""
        if isinstance(message, FrontierMarker):
            key = (message.part[0], message.through_ms)
            self._parts = message.part[1]
        else:
            assert message.frontier_batch is not None  # noqa: S101 - routed here by it
            key = (0 if message.part is None else message.part[0], message.frontier_batch)
        batch = self._batches.setdefault(key, _Batch())
        if isinstance(message, FrontierMarker):
            batch.marker = message
        else:
            batch.messages.append(message)
        if batch.marker is None or len(batch.messages) < batch.marker.messages:
            return None
        del self._batches[key]
        self._through[key[0]] = max(key[1], self._through.get(key[0], key[1]))
        applied = [w for m in batch.messages if (w := self._table.add(m)) is not None]
        if not applied:
            return None
        frames = [w.frame for w in applied]
        replaced = [w.replaced for w in applied if w.replaced is not None]
        return replace(applied[0], start_ms=min(w.start_ms for w in applied),
                       end_ms=max(w.end_ms for w in applied),
                       window_rows=sum(w.window_rows for w in applied),
                       frame=pl.concat(frames, how="diagonal_relaxed"),
                       replaced=pl.concat(replaced, how="diagonal_relaxed") if replaced
                       else None)

    def through(self) -> int | None:
        """Every session ending at or before this is in (None: some part has said
        nothing yet)."""
        if self._parts is None or len(self._through) < self._parts:
            return None
        return min(self._through.values())
