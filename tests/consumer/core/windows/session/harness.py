"""Session windows under test: a DuckDB reference (sort and scan with LAG, written
independently of the engine) and a miniature run loop that commits, crashes and
restarts the way the daemon does, with plain frames and no broker."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import polars as pl

from consumer.core.offsets import CommitPoint
from consumer.core.plan import AggregationPlan, Quantile, derive_plan
from consumer.core.types import ClosedWindow, PartitionKey
from consumer.core.windows.session.engine import SessionWindowEngine
from consumer.core.windows.session.spans import SessionSpec
from tests.consumer.core.windows.helpers import EVENT_PLAN, SCHEMA, UTC_MS, Row, frame, ref
from wire.output import decode_output, encode_window
from wire.sessions import SessionTable

SORT = ["k", "window_start"]
# Aggregates that do not decompose, and DuckDB's for them over a session's rows.
HOLISTIC_PLAN = derive_plan(
    SCHEMA, time_column="ts",
    overrides={"v_sum": "median", "n_count": "n_unique", "v_max": Quantile(0.75)},
    expressions={"spread": "pl.col('v_max').max() - pl.col('v_max').min()"})
# quantile_cont is linear interpolation, as Polars' 'linear'; median is its q = 0.5.
HOLISTIC_SQL = """quantile_cont(v_sum, 0.5) AS v_sum, count(DISTINCT n_count) AS n_count,
    quantile_cont(v_max, 0.75) AS v_max, max(v_max) - min(v_max) AS spread"""


def session_engine(*, gap_ms: int = 100, max_session_ms: int | None = None,
                   lateness_ms: int = 0, idle_timeout_ms: int = 60_000,
                   plan: AggregationPlan = EVENT_PLAN,
                   revise_within_ms: int | None = None,
                   provisional: bool = False) -> SessionWindowEngine:
    return SessionWindowEngine(plan, SessionSpec(gap_ms, max_session_ms), event_time=True,
                               time_dtype=UTC_MS, allowed_lateness_ms=lateness_ms,
                               idle_timeout_ms=idle_timeout_ms,
                               revise_within_ms=revise_within_ms, provisional=provisional)


# The aggregates of EVENT_PLAN, in SQL.
SUMS = """SUM(v_sum) AS v_sum, SUM(n_count)::BIGINT AS n_count, MAX(v_max) AS v_max"""


def session_reference(rows: Iterable[Row], gap_ms: int, max_session_ms: int | None = None,
                      aggregates: str = SUMS) -> pl.DataFrame:
    """Sessions by DuckDB SQL: LAG finds where a key's gap is reached, a running SUM
    numbers the sessions; with a maximum, the key is partitioned by its interval too.
    ``aggregates``: the SQL of the plan's aggregates over a session's rows."""
    input_rows = frame(list(rows)).to_arrow()  # noqa: F841 - read by DuckDB's replacement scan
    bucket = f"floor(epoch_ms(ts) / {max_session_ms})::BIGINT" if max_session_ms else "0"
    end = (f"LEAST(MAX(t) + {gap_ms}, (bucket + 1) * {max_session_ms})" if max_session_ms
           else f"MAX(t) + {gap_ms}")
    sql = f"""
        WITH timed AS (SELECT *, epoch_ms(ts) AS t, {bucket} AS bucket FROM input_rows),
        marked AS (
            SELECT *, CASE WHEN t - LAG(t) OVER (PARTITION BY k, bucket ORDER BY t) < {gap_ms}
                      THEN 0 ELSE 1 END AS starts
            FROM timed),
        numbered AS (
            SELECT *, SUM(starts) OVER (PARTITION BY k, bucket ORDER BY t, starts DESC
                                        ROWS UNBOUNDED PRECEDING) AS session
            FROM marked)
        SELECT MIN(t) AS window_start, {end} AS window_end, k, {aggregates},
               COUNT(*)::BIGINT AS row_count
        FROM numbered GROUP BY k, bucket, session
    """  # noqa: S608 - only integers and the tests' own SQL are formatted in
    with duckdb.connect() as con:
        result: pl.DataFrame = con.sql(sql).pl()
    return result.with_columns(pl.col("window_start", "window_end").cast(UTC_MS)).sort(
        SORT, nulls_last=True)


def feed(engine: SessionWindowEngine, partition: PartitionKey, offset: int,
         rows: Sequence[Row], now_ms: int) -> pl.DataFrame | None:
    """Add one message's rows."""
    return engine.add(frame(rows), [ref(partition, offset, rows)], now_ms)


def committable(engine: SessionWindowEngine) -> dict[PartitionKey, CommitPoint]:
    """The engine's commit points, where a test expects it not to hold them back."""
    points = engine.commit_points()
    assert points is not None
    return points


def emitted(windows: Sequence[ClosedWindow], aggregates: str = SUMS) -> pl.DataFrame:
    """Every session row of ``windows``, in the reference's order and without
    ``replaces`` (``aggregates``: the reference's, for the columns of none)."""
    if not windows:
        return session_reference([], 1, aggregates=aggregates).clear()
    return pl.concat([w.frame for w in windows]).drop("replaces", strict=False).sort(
        SORT, nulls_last=True)


# -- a run loop in miniature --------------------------------------------------------------

Message = list[Row]


@dataclass
class Output:
    """What reached committed output: session windows and late rows."""

    windows: list[ClosedWindow] = field(default_factory=list)
    late: list[pl.DataFrame] = field(default_factory=list)

    def late_rows(self) -> int:
        return sum(f.height for f in self.late)


@dataclass
class MiniDaemon:
    """Polls ``schedule`` (partitions, in delivery order) through an engine, flushing
    (close, commit) after every poll; a crash throws away the uncommitted and restarts
    from the committed offsets with their metadata, as the daemon's processor does."""

    partitions: dict[PartitionKey, list[Message]]
    gap_ms: int = 100
    max_session_ms: int | None = None
    lateness_ms: int = 0
    plan: AggregationPlan = EVENT_PLAN
    revise_within_ms: int | None = None
    provisional: bool = False  # early results at every flush
    output: Output = field(default_factory=Output)
    now: int = 0
    crashes: int = 0

    def __post_init__(self) -> None:
        self._committed: dict[PartitionKey, CommitPoint] = {}
        self._start()

    def _start(self) -> None:
        self.engine = session_engine(gap_ms=self.gap_ms, max_session_ms=self.max_session_ms,
                                     lateness_ms=self.lateness_ms, plan=self.plan,
                                     revise_within_ms=self.revise_within_ms,
                                     provisional=self.provisional)
        self._position = {}
        for partition in self.partitions:
            point = self._committed.get(partition)
            self.engine.assign(partition, point.offset if point else None,
                               point.metadata if point else None, self.now)
            self._position[partition] = point.offset if point else 0
        self._pending = Output()

    def done(self) -> bool:
        return all(self._position[p] >= len(m) for p, m in self.partitions.items())

    def poll(self, order: Sequence[PartitionKey]) -> None:
        """Deliver the next message of each partition in ``order`` (those with one left)."""
        self.now += 1
        delivered = []
        for partition in order:
            offset = self._position[partition]
            if offset < len(self.partitions[partition]):
                delivered.append((partition, offset, self.partitions[partition][offset]))
                self._position[partition] += 1
        if not delivered:
            return
        for partition, offset, message in delivered:
            if not message:
                self.engine.skip(partition, offset, self.now)
        delivered = [d for d in delivered if d[2]]
        if not delivered:
            return
        rows = [row for _, _, message in delivered for row in message]
        refs = [ref(p, o, m) for p, o, m in delivered]
        late = self.engine.add(frame(rows), refs, self.now)
        if late is not None:
            self._pending.late.append(late)

    def flush(self, now: int | None = None, *, early: bool = False) -> None:
        """Close what is due (and, ``early``, emit the rest as revisions, as the memory
        budget does); commit it with the offsets, unless the engine holds commits back
        (then it stays pending, as the pipeline holds it)."""
        self.now = now if now is not None else self.now
        self._pending.windows += self.engine.close_due(self.now)
        if early:
            self._pending.windows += self.engine.emit_early(self.now)
        self._pending.windows += self.engine.provisional(self.now)
        points = self.engine.commit_points()
        if points is None:
            return
        self.output.windows += self._pending.windows
        self.output.late += self._pending.late
        self._committed.update(points)
        self._pending = Output()

    def crash(self) -> None:
        self.crashes += 1
        self._start()

    def finish(self) -> Output:
        """Consume the rest, then close everything on idleness and commit."""
        everyone = list(self.partitions)
        while not self.done():
            self.poll(everyone)
            self.flush()
        self.flush(10**12)
        return self.output


# -- a subscriber ---------------------------------------------------------------------------


def held_sessions(windows: Sequence[ClosedWindow], aggregates: str = SUMS) -> pl.DataFrame:
    """What a subscriber holds after applying ``windows`` in order, as docs/wire-format.md
    says (written here from that text, not from the engine), each row kept as a part of
    its session: a repeat (keys, start as sent, revision, kind) is skipped; the sessions
    of its keys a row names in ``replaces`` must be held under a lower revision (or a
    provisional revision took them out), and the parts a ``full`` or ``update`` gave are
    removed, as are the provisional sessions (early results) of its keys starting within
    its bounds; a provisional row is then held as it is. A ``full`` or ``update`` row
    replaces the parts a ``full`` or ``update`` gave at its keys and start; then the row
    and the held sessions of its keys whose windows overlap it are one session, from the
    earliest start. Returns the sessions (their parts added up) in the reference's order,
    without ``replaces`` (``aggregates``: the reference's, for the columns; only
    EVENT_PLAN's sums add up)."""
    parts: list[dict[str, Any]] = []
    taken_early: set[tuple[object, object]] = set()
    for window in windows:
        provisional = not window.final and window.kind == "update"
        for row in window.frame.to_dicts():
            sent = (row["k"], row["window_start"], window.revision, window.kind)
            if any(sent == p["__sent"] for p in parts):
                continue
            row.update(__revision=window.revision, __delta=window.kind == "delta",
                       __sent=sent, __provisional=provisional)
            for start in row.pop("replaces", None) or []:
                named = [p for p in parts if (p["k"], p["window_start"]) == (row["k"], start)]
                # ... or a provisional revision of the session took it out already.
                assert named or (row["k"], start) in taken_early, (
                    f"revision {window.revision} replaces {row['k']}@{start}, not held")
                assert all(p["__revision"] < window.revision for p in named)
                parts = [p for p in parts if p not in named or p["__delta"]]
                if provisional:
                    taken_early.add((row["k"], start))
            parts = [p for p in parts if not (  # provisional sessions it supersedes
                p["__provisional"] and p["k"] == row["k"]
                and row["window_start"] <= p["window_start"] < row["window_end"])]
            if provisional:
                parts.append(row)
                continue
            if not row["__delta"]:  # whole: it replaces its own session, bar the deltas
                parts = [p for p in parts if p["__delta"] or (p["k"], p["window_start"]) != (
                    row["k"], row["window_start"])]
            joined = _overlapping(parts, row)
            row["window_start"] = min([row["window_start"],
                                       *(p["window_start"] for p in joined)])
            for part in joined:
                part["window_start"] = row["window_start"]
            parts.append(row)
    empty = emitted([], aggregates)
    if not parts:
        return empty
    def added(column: str) -> pl.Expr:
        whole = pl.col(column).first()
        if column in ("window_end", "v_max"):
            return pl.col(column).max() if column == "window_end" else \
                pl.when(pl.len() == 1).then(whole).otherwise(pl.col(column).max())
        if column in ("v_sum", "n_count", "row_count"):
            return pl.when(pl.len() == 1).then(whole).otherwise(pl.col(column).sum())
        return whole  # a holistic column: sessions of it go out whole, never in parts

    others = [c for c in empty.columns if c not in ("k", "window_start")]
    frame = pl.DataFrame([{c: p[c] for c in empty.columns} for p in parts],
                         schema=empty.schema)
    return frame.group_by("k", "window_start").agg(*(added(c).alias(c) for c in others)
                                                   ).select(empty.columns).sort(
        SORT, nulls_last=True)


def table_sessions(windows: Sequence[ClosedWindow]) -> pl.DataFrame:
    """What ``wire.sessions.SessionTable`` (read_output(complete=True)) holds after the
    engine's ``windows`` went out as messages, its rows of one session added up
    (EVENT_PLAN's columns)."""
    table = SessionTable()
    for window in windows:
        for message in encode_window(
                window.frame, start_ms=window.start_ms, end_ms=window.end_ms,
                input_rows=window.input_rows, fmt="arrow", compression="zstd",
                max_bytes=1_000_000, revision=window.revision, final=window.final,
                kind=window.kind, keys=["k"], sessions=True):
            table.add(decode_output(message.value, message.headers))
    empty = emitted([])
    held = table.sessions()
    if held.height == 0:
        return empty
    return held.group_by("k", "window_start").agg(
        pl.col("window_end", "v_max").max(), pl.col("v_sum", "n_count", "row_count").sum(),
    ).select(empty.columns).cast(empty.schema).sort(SORT, nulls_last=True)

def _overlapping(parts: list[dict[str, Any]], row: dict[str, Any]) -> list[dict[str, Any]]:
    """The held parts of the sessions of ``row``'s keys whose windows overlap its window,
    directly or through each other (a session's window: its earliest start, its parts'
    latest end)."""
    found: list[dict[str, Any]] = []
    start, end = row["window_start"], row["window_end"]
    parts = [p for p in parts if not p["__provisional"]]
    while True:
        near = [p for p in parts if p["k"] == row["k"] and p not in found
                and p["window_start"] < end and start < p["window_end"]]
        # ... with the other parts of their sessions.
        starts = {p["window_start"] for p in near}
        more = [p for p in parts if p["k"] == row["k"] and p not in found
                and (p in near or p["window_start"] in starts)]
        if not more:
            return found
        found += more
        start = min([start, *(p["window_start"] for p in more)])
        end = max([end, *(p["window_end"] for p in more)])


def not_late(rows: Sequence[Row], late: Sequence[pl.DataFrame]) -> list[Row]:
    """``rows`` less the late ones (each late row an input row, taken out once)."""
    left = list(rows)
    for frame_ in late:
        for k, ts, v_sum, n_count, v_max in frame_.select(
                "k", pl.col("ts").dt.epoch("ms"), "v_sum", "n_count", "v_max").rows():
            left.remove((k, ts, v_sum, n_count, v_max))
    return left
