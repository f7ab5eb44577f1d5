"""What a session engine does while it re-reads input from before a restart or takeover.

The commit metadata cannot say, row by row, which replayed rows were emitted: a
session's end depends on all of its rows. The replay therefore rebuilds sessions from
the replayed rows first, and only once every partition has caught up decides: a session
ending at or before the frontier of its rows' partitions was emitted (its rows are
skipped), any other one is still open. docs/design.md ("Session windows") shows why
that is exact, and why new rows before the frontier wait for that decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import polars as pl

from consumer.core.types import (
    MESSAGE_INDEX,
    NO_WINDOW,
    ORIGIN_OFFSET,
    ORIGIN_PARTITION,
    ORIGIN_TOPIC,
    MessageRef,
    PartitionKey,
)
from consumer.core.windows.session.closing import CT_END, key_hashes, rows_of
from consumer.core.windows.session.session_set import SessionSet
from consumer.core.windows.session.spans import (
    END,
    EVENT_MS,
    FRONTIER,
    ROW_FRONTIER,
    SessionSpec,
    with_runs,
)


@dataclass(frozen=True)
class HeldPoll:
    """New rows of one poll that may be late or join a replayed session: they wait.
    ``waiting``: per partition, the first message with rows among them."""

    rows: pl.DataFrame
    refs: list[MessageRef]
    seq: int
    waiting: dict[PartitionKey, int]


@dataclass
class SessionReplay:
    sessions: SessionSet
    keys: Sequence[str]
    spec: SessionSpec
    # Restored from the commit metadata: key hash -> its rows before this time are
    # closed (emitted, or in the late topic), its rows at or after it are open.
    listed: dict[int, int] = field(default_factory=dict)
    # Listed keys met among replayed rows (keys and ``CT_END``), per poll, for the
    # engine to take over.
    matched: list[tuple[pl.DataFrame, int]] = field(default_factory=list)
    held: list[HeldPoll] = field(default_factory=list)
    skipped_rows: int = 0

    def cardinality(self) -> int:
        """Groups held: the rebuilt sessions and the rows of the polls that wait."""
        return len(self.sessions) + sum(h.rows.height for h in self.held)

    def restore(self, closed: Sequence[tuple[int, int]]) -> None:
        for key_hash, through_ms in closed:
            self.listed[key_hash] = max(through_ms, self.listed.get(key_hash, through_ms))

    def take(self, rows: pl.DataFrame, replayed: pl.Series, refs: Sequence[MessageRef],
             seq: int, frontier_ms: int | None) -> None:
        """Rows of one poll: replayed ones rebuild sessions; new ones join them when
        they lie at or after every frontier (nothing there is closed), else wait."""
        old = rows.filter(replayed)
        new = rows.filter(~replayed)
        if self.listed and old.height:
            old = self._without_listed(old, seq)
        if frontier_ms is None:
            safe, waiting = new, new.clear()
        else:
            early = pl.col(EVENT_MS) < frontier_ms
            safe, waiting = new.filter(~early), new.filter(early)
        rebuilt = pl.concat([old, safe])
        if rebuilt.height:
            runs = self.sessions.runs(with_runs(rebuilt, self.keys, self.spec), seq)
            self.sessions.add(self.sessions.merge_in(runs))
        if waiting.height:
            first: dict[PartitionKey, int] = {}
            for index in waiting.get_column(MESSAGE_INDEX).unique().to_list():
                ref = refs[index]
                first[ref.partition] = min(ref.offset, first.get(ref.partition, ref.offset))
            self.held.append(HeldPoll(waiting, list(refs), seq, first))

    def _without_listed(self, old: pl.DataFrame, seq: int) -> pl.DataFrame:
        """``old`` without the rows of listed keys before their listed time; their rows
        at or after it are open whatever their rebuilt session's end (no frontier)."""
        distinct = old.select(self.keys).unique(maintain_order=True) if self.keys else None
        tuples = rows_of(distinct, self.keys) if distinct is not None else [()]
        through = [self.listed.get(h) for h in key_hashes(tuples)]
        if all(t is None for t in through):
            return old
        if distinct is None:
            table = pl.DataFrame({CT_END: through}, schema={CT_END: pl.Int64})
            marked = old.with_columns(pl.lit(through[0], pl.Int64).alias(CT_END))
        else:
            table = distinct.with_columns(pl.Series(CT_END, through, dtype=pl.Int64)).filter(
                pl.col(CT_END).is_not_null())
            marked = old.join(table, on=list(self.keys), how="left", nulls_equal=True,
                              maintain_order="left")
        self.matched.append((table, seq))
        listed = pl.col(CT_END).is_not_null()
        closed = listed & (pl.col(EVENT_MS) < pl.col(CT_END))
        self.skipped_rows += marked.filter(closed).height
        return marked.filter(~closed).with_columns(
            pl.when(listed).then(pl.lit(NO_WINDOW, pl.Int64)).otherwise(pl.col(ROW_FRONTIER))
            .alias(ROW_FRONTIER)).drop(CT_END)

    def min_seq(self) -> int | None:
        seqs = [s for s in (self.sessions.min_seq(), *(h.seq for h in self.held))
                if s is not None]
        return min(seqs, default=None)

    def waiting(self) -> dict[PartitionKey, int]:
        """Per partition, the first message whose rows wait."""
        first: dict[PartitionKey, int] = {}
        for held in self.held:
            for partition, offset in held.waiting.items():
                first[partition] = min(offset, first.get(partition, offset))
        return first

    def resolve(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        """(the rebuilt sessions that were emitted before, those still open)."""
        rebuilt = self.sessions.pop(pl.lit(value=True))
        if rebuilt.height == 0:
            return rebuilt, rebuilt
        emitted = pl.col(END) <= pl.col(FRONTIER)
        return rebuilt.filter(emitted), rebuilt.filter(~emitted)


def named_by_origin(late: pl.DataFrame, refs: Sequence[MessageRef], first: int,
                    ) -> pl.DataFrame:
    """Late rows of a held poll, naming their message (``ORIGIN_*``) for ``late.py``:
    their ``MESSAGE_INDEX`` becomes negative, from ``-1 - first`` on."""
    index = late.get_column(MESSAGE_INDEX)
    return late.with_columns(
        pl.Series(ORIGIN_TOPIC, [r.partition[0] for r in refs]).gather(index),
        pl.Series(ORIGIN_PARTITION, [r.partition[1] for r in refs], dtype=pl.Int64).gather(index),
        pl.Series(ORIGIN_OFFSET, [r.offset for r in refs], dtype=pl.Int64).gather(index),
        (-1 - first - index).alias(MESSAGE_INDEX),
    )
