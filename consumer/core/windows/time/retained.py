"""Emitted windows kept for revisions (``window.late: revise``).

When a window closes, its merged state (and buffered values) moves here instead of
being dropped, and stays until the watermark passes its end plus
``revision_lateness_ms``. A late row within that bound is merged into it and marks its
(window, keys) group changed; at the next flush each changed group's new results go out
as the window's next revision (``kind: update``), numbered on from the last one.

The state lives only in memory, like the open windows': the commit offsets stay at the
first message with rows in a kept window, so a replay rebuilds it (``add(...,
changed=False)``), and the commit metadata carries the revision numbers past 0
(``Retention``). The kept windows have an aggregator of their own: states move across
by ``export_state``/``import_state``, so each aggregator renews its key ids on its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import polars as pl

from consumer.core.aggregate import PartialAggregator
from consumer.core.plan import AggregationPlan
from consumer.core.types import WINDOW_START, ClosedWindow
from consumer.core.windows.frontier import PartitionFrontier, later
from consumer.core.windows.store import Taken, WindowStore


@dataclass
class _Kept:
    end_ms: int
    revision: int | None = None  # the last one emitted (None: the window never went out)
    changed: list[pl.DataFrame] = field(default_factory=list)  # group keys, decoded


class RetainedWindows:
    def __init__(self, plan: AggregationPlan, *, merge_every: int) -> None:
        self._aggregator = PartialAggregator(plan, (WINDOW_START, *plan.keys))
        self._store = WindowStore(self._aggregator, merge_every=merge_every)
        self._kept: dict[int, _Kept] = {}  # by window start
        self._restored: dict[int, int] = {}  # window start -> last revision, before a restart

    def restore(self, revisions: Mapping[int, int]) -> None:
        """The last revision of each kept window past revision 0, as committed."""
        for start, revision in revisions.items():
            self._restored[start] = max(revision, self._restored.get(start, 0))

    def keep(self, taken: Taken, exported: pl.DataFrame,
             revisions: Mapping[int, int]) -> None:
        """Keep windows that have just closed: ``exported`` is their merged state in
        exported form, ``revisions`` the revision each closed with."""
        if not taken.ends:
            return
        state = self._aggregator.import_state(exported)
        self._store.add(state, taken.ends, grouped=True, values=taken.values)
        for start, end in taken.ends.items():
            self._kept[start] = _Kept(end, revisions.get(start, 0))

    def add(self, rows: pl.DataFrame, ends: Mapping[int, int], *, changed: bool) -> None:
        """Merge ``rows`` (windowed, of emitted windows) into the kept state: late rows
        (``changed``: their groups get a revision) or a replay's (rebuilding the state
        as it was)."""
        if rows.height == 0:
            return
        present = {int(s): ends[int(s)] for s in rows[WINDOW_START].unique().to_list()}
        partial = self._aggregator.partial(rows.lazy())
        self._store.add(partial, present, rows=rows.lazy())
        keys = self._aggregator.export_state(partial).select(self._aggregator.group_by)
        for start, end in present.items():
            self._note(start, end, keys.filter(pl.col(WINDOW_START) == start), changed=changed)

    def add_state(self, start: int, end: int, *, state: pl.DataFrame | None = None,
                  values: pl.DataFrame | None = None, changed: bool) -> None:
        """Merge an exported partial ``state`` (or, for aggregates that do not decompose,
        buffered ``values``) of the emitted window at ``start`` into the kept state, as
        ``add`` merges rows: stage 2 of the scale-out gets them from stage 1."""
        if values is not None:
            self._store.add_values(start, end, values)
        if state is None or state.height == 0:
            return
        self._store.add(self._aggregator.import_state(state), {start: end}, grouped=True,
                        values={})
        self._note(start, end, state.select(self._aggregator.group_by), changed=changed)

    def _note(self, start: int, end: int, keys: pl.DataFrame, *, changed: bool) -> None:
        kept = self._kept.setdefault(start, _Kept(end))
        if start in self._restored:  # it went out before the restart, to here
            kept.revision = max(kept.revision or 0, self._restored[start])
        elif not changed and kept.revision is None:
            kept.revision = 0  # a replay's rows: the window went out, as revision 0
        if changed:
            kept.changed.append(keys)

    def changed(self) -> bool:
        return any(kept.changed for kept in self._kept.values())

    def revisions(self) -> list[ClosedWindow]:
        """The changed groups of each window, as its next revision."""
        out = []
        for start, kept in sorted(self._kept.items()):
            if not kept.changed:
                continue
            groups = pl.concat(kept.changed).unique(maintain_order=True)
            kept.changed = []
            # A window that never went out (no row came before the watermark passed it)
            # holds only late rows: its first emission is the whole window, revision 0.
            first = kept.revision is None
            kept.revision = 0 if kept.revision is None else kept.revision + 1
            window = self._store.peek(start, groups)
            out.append(ClosedWindow(start, kept.end_ms, window.frame, window.input_rows,
                                    final=True, revision=kept.revision,
                                    kind="full" if first else "update"))
        return out

    def expire(self, frontiers: Iterable[PartitionFrontier], through_ms: int) -> None:
        """Kept windows ending at or before ``through_ms`` are past their revisions, for
        every partition; those all partitions are past are dropped."""
        frontiers = list(frontiers)
        for frontier in frontiers:
            frontier.kept_after = later(frontier.kept_after, through_ms)
        afters = [f.kept_after for f in frontiers]
        if afters and None not in afters:
            self.drop_through(min(a for a in afters if a is not None))

    def drop_through(self, through_ms: int | None) -> None:
        """Forget the windows ending at or before ``through_ms``: no revision is due."""
        if through_ms is None:
            return
        self._store.take_closed(through_ms)
        for start in [s for s, k in self._kept.items() if k.end_ms <= through_ms]:
            del self._kept[start]
            self._restored.pop(start, None)

    def drop_all(self) -> None:
        self._store.discard()
        self._kept.clear()
        self._restored.clear()

    def revision_numbers(self) -> tuple[tuple[int, int], ...]:
        """(start, last revision) of the kept windows past revision 0, for the commit."""
        return tuple((start, kept.revision) for start, kept in sorted(self._kept.items())
                     if kept.revision)

    def cardinality(self) -> int:
        return self._store.cardinality()

    def merge_pending(self) -> None:
        self._store.merge_pending()

    def buffered_values(self) -> int:
        return self._store.buffered_values()

    def window_count(self) -> int:
        return len(self._kept)
