"""Session output as a subscriber holds it: the sessions, one row each (more for a
session that went out early in deltas), with every revision applied.

Each row of session output is a session with its own bounds, identified by its keys and
``window_start``. A row also names, in ``replaces``, the ``window_start`` of the emitted
sessions of its keys it replaces: a late row extended or bridged them (``window.late:
revise``). docs/wire-format.md
("Session windows") gives the rule this applies: a row whose session already holds one
of its revision and kind (by the start it was sent with) is a repeat (at-least-once
output) and is skipped; the replaced sessions a ``full`` or ``update`` row gave are
removed (the row holds their rows), and so is a session that a ``full`` or ``update``
row gave at the row's own keys and start, if the row is whole too. Then sessions of the
same keys whose windows overlap are one session: the row and the held sessions of its
keys it overlaps (directly or through each other) take the earliest start among them,
their rows kept here as rows to add up. That joins a session's deltas when its start
moved, and what a restart sends of a session it does not fully know (an early revision
let its rows go) to the rest of it.

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
_SENT = "__sent_start"  # a row's window_start as the output gave it
_ARRIVING = "__arriving"
_PIECE = "__piece"
_MERGED = "__merged_start"
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
        are in, apply it and return it whole: ``frame``, the rows it put in the table (its
        own, and the held rows of deltas it joined, under the start of the session they
        make), and ``replaced``, the held rows it took out (those of a session it gives
        whole again, and those it moved, as they stood)."""
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
        put_in, taken_out = self.apply(replace(message, chunk=(1, 1), frame=rows))
        return replace(message, chunk=(1, 1), frame=put_in, replaced=taken_out)

    def apply(self, window: OutputWindow) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Apply one whole revision; return the rows it put in and those it took out."""
        keys = list(window.keys or ())
        provisional = not window.final and window.kind == "update"
        rows = window.frame.with_columns(pl.lit(window.revision, pl.Int64).alias(_REVISION),
                                         pl.lit(window.kind).alias(_KIND),
                                         pl.lit(provisional).alias(_PROVISIONAL),
                                         pl.col("window_start").alias(_SENT))
        if self._held is None or self._held.height == 0:
            self._store(rows)
            return _visible(rows), _visible(rows.clear())
        on = [*keys, "window_start"]
        # A repeat (at-least-once output) has the start it was sent with, which a held
        # row keeps when a later row moves it.
        rows = rows.join(self._held.select(*keys, _SENT, _REVISION, _KIND),
                         on=[*keys, _SENT, _REVISION, _KIND], how="anti", nulls_equal=True,
                         maintain_order="left")
        # Named sessions that deltas gave are not gone: their rows are in no later row,
        # and they overlap the row that names them, which joins them below.
        gone = pl.concat([
            self._held.filter(pl.col(_KIND) != "delta").join(
                self._replaced(rows, keys), on=on, how="semi", nulls_equal=True),
            self._superseded(rows, keys)]).unique()
        if window.kind != "delta":  # whole: it replaces its own session, bar the deltas
            gone = pl.concat([gone, self._held.filter(pl.col(_KIND) != "delta").join(
                rows.select(on), on=on, how="semi", nulls_equal=True)]).unique()
        self._held = self._held.join(gone.select(*on, _REVISION, _KIND),
                                     on=[*on, _REVISION, _KIND], how="anti", nulls_equal=True)
        rows, moved = self._joined(rows, keys)
        self._store(rows)
        return _visible(pl.concat([rows, moved.with_columns(pl.col(_MERGED).alias(
            "window_start"))], how="diagonal_relaxed").drop(_MERGED, strict=False)), \
            _visible(pl.concat([gone, moved.drop(_MERGED)], how="diagonal_relaxed"))

    def _joined(self, rows: pl.DataFrame, keys: list[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Sessions of the same keys whose windows overlap are one session: ``rows`` and
        the held sessions they overlap (directly or through each other) take the earliest
        start among them. Returns ``rows`` so started, and the held rows that moved (as
        they stood, with ``_MERGED``: their new start); the table holds those under their
        new start already."""
        assert self._held is not None  # noqa: S101 - called with sessions held
        on = [*keys, "window_start"]
        new = rows.filter(~pl.col(_PROVISIONAL))
        held = self._held.filter(~pl.col(_PROVISIONAL))
        if keys:
            held = held.join(new.select(keys).unique(), on=keys, how="semi", nulls_equal=True)
        if new.height == 0 or held.height == 0:
            return rows, _none_moved(self._held)

        def spans(frame: pl.DataFrame, *, arriving: bool) -> pl.DataFrame:
            return frame.group_by(on).agg(pl.col("window_end").max()).with_columns(
                pl.lit(arriving).alias(_ARRIVING))

        def per_keys(expr: pl.Expr) -> pl.Expr:
            return expr.over(keys) if keys else expr

        # Sort and scan, as sessions are made: a span starting at or after every earlier
        # one's end (of its keys) starts another session.
        every = pl.concat([spans(held, arriving=False), spans(new, arriving=True)]).sort(
            on, nulls_last=True)
        reach = per_keys(pl.col("window_end").cum_max().shift(1))
        every = every.with_columns(per_keys(
            (reach.is_null() | (pl.col("window_start") >= reach)).cum_sum()).alias(_PIECE))
        session = [*keys, _PIECE]
        moving = every.filter(pl.col(_ARRIVING).any().over(session)).with_columns(
            pl.col("window_start").min().over(session).alias(_MERGED),
        ).filter(pl.col("window_start") != pl.col(_MERGED))
        if moving.height == 0:
            return rows, _none_moved(self._held)
        held_moving = moving.filter(~pl.col(_ARRIVING)).select(*on, _MERGED)
        moved = self._held.filter(~pl.col(_PROVISIONAL)).join(held_moving, on=on,
                                                              nulls_equal=True)
        self._held = pl.concat([
            self._held.join(held_moving.select(on), on=on, how="anti", nulls_equal=True),
            moved.with_columns(pl.col(_MERGED).alias("window_start")).drop(_MERGED)],
            how="diagonal_relaxed")
        started = rows.join(moving.filter(pl.col(_ARRIVING)).select(*on, _MERGED), on=on,
                            how="left", nulls_equal=True, maintain_order="left").with_columns(
            pl.coalesce(_MERGED, "window_start").alias("window_start")).drop(_MERGED)
        return started, moved

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
        """(keys, window_start) of the sessions ``rows`` name as replaced."""
        if REPLACES_COLUMN not in rows.columns:
            return rows.select(*keys, "window_start").clear()
        named = rows.select(*keys, pl.col(REPLACES_COLUMN).alias(_GONE)).explode(_GONE)
        return named.drop_nulls(_GONE).select(
            *keys, pl.col(_GONE).cast(rows.schema["window_start"]).alias("window_start"))

    def _store(self, rows: pl.DataFrame) -> None:
        held = rows if self._held is None else pl.concat([self._held, rows],
                                                         how="diagonal_relaxed")
        if held.height > self._max_held:
            held = held.sort("window_end").tail(self._max_held)
        self._held = held

    def sessions(self) -> pl.DataFrame:
        """Every session held, its rows as the output gave them (under the start of the
        session they make, for the rows of deltas joined since)."""
        if self._held is None:
            return pl.DataFrame()
        return _visible(self._held)


def _none_moved(held: pl.DataFrame) -> pl.DataFrame:
    return held.clear().with_columns(pl.col("window_start").alias(_MERGED))


def _visible(rows: pl.DataFrame) -> pl.DataFrame:
    """``rows`` without the table's own columns."""
    return rows.drop(_REVISION, _KIND, _PROVISIONAL, _SENT, strict=False)


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
