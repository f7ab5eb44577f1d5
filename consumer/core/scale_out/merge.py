"""Stage 2 of the scale-out, for one repartition partition: merge the partial states of
the (window, keys) groups that hash here, and emit a window only when it is complete.

A window is complete when every input partition's stage-1 owner has reported a frontier
at or past its end: ``floor`` is the minimum over the input partitions that are not
idle (their owners say so), or, when all are idle, the furthest any has reached. An input
partition this partition has no report of yet holds everything back. Reports are read
from this repartition partition only, in order: a report moving an input partition past
a window comes after that partition's partials for it here (stage 1 writes both in one
transaction, partials first), so what is merged here is then all there is.

Every window some stage-1 instance announced is emitted here when complete, with the
rows of its keys that hash here (maybe none), so that subscribers get one end-of-window
marker per repartition partition. Like the other engines it keeps no state anywhere but
in memory: a restart replays the repartition partition from its committed offset, and
the commit metadata's frontier says which windows it already emitted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

import polars as pl

from consumer.core.aggregate import PartialAggregator
from consumer.core.expressions import parse_expression
from consumer.core.offsets import CommitMetadata, CommitPoint, OffsetTracker
from consumer.core.plan import AggregationPlan, ColumnAgg, ExpressionAgg
from consumer.core.scale_out.kept import KeptWindows
from consumer.core.types import NO_WINDOW, WINDOW_START, ClosedWindow, PartitionKey
from consumer.core.windows.store import WindowStore
from wire.repartition import KIND_VALUES, Partial, ProgressRecord


@dataclass(frozen=True)
class EarlyPart:
    """What this partition's part of a window sent before it closed: its revisions so
    far, and what the early ones (the memory budget: deltas, the part started afresh)
    held, for its end-of-window marker. Provisional revisions (early results) take a
    number and hold nothing a subscriber adds up."""

    next_revision: int = 0
    messages: int = 0
    rows: int = 0
    input_rows: int = 0
    emptied: int = 0  # 1: an early revision took rows out of the part (it closes as delta)


@dataclass(frozen=True)
class Completed:
    """A window this partition has emitted: its results here (``window`` is None when
    none of its groups hash here)."""

    start_ms: int
    end_ms: int
    window: ClosedWindow | None


@dataclass
class Reports:
    """The input partitions' progress as reported to this repartition partition."""

    known: set[PartitionKey]
    frontiers: dict[PartitionKey, tuple[int | None, bool]] = field(default_factory=dict)

    def update(self, progress: ProgressRecord) -> None:
        for report in progress.partitions:
            key = (report.topic, report.partition)
            self.known.add(key)
            before = self.frontiers.get(key, (None, False))[0]
            frontier = report.frontier_ms if before is None or report.frontier_ms is None \
                else max(before, report.frontier_ms)
            self.frontiers[key] = (frontier if frontier is not None else before, report.idle)

    def floor(self) -> int | None:
        """Through where every input partition's rows are here; None: not known yet."""
        live = []
        for key in self.known:
            frontier, idle = self.frontiers.get(key, (None, False))
            if not idle:
                if frontier is None:
                    return None
                live.append(frontier)
        if live:
            return min(live)
        ends = [f for f, _ in self.frontiers.values() if f is not None]
        return max(ends) if ends else None

    def holding_back(self) -> list[PartitionKey]:
        """The live input partitions at the floor: the ones windows wait for."""
        floor = self.floor()
        return sorted(key for key in self.known
                      if not self.frontiers.get(key, (None, False))[1]
                      and self.frontiers.get(key, (None, False))[0] in (None, floor))


class MergeEngine:
    def __init__(self, partition: PartitionKey, inputs: set[PartitionKey], *,
                 committed: int | None, metadata: CommitMetadata | None,
                 merge_every: int, revise_within_ms: int | None = None,
                 provisional: bool = False) -> None:
        """``revise_within_ms`` (window.late: revise): keep emitted windows this long past
        the floor and revise them with the partials that come for them. ``provisional``:
        note changed groups, for early results."""
        self.partition = partition
        self._reports = Reports(set(inputs))
        self._merge_every = merge_every
        self._track_changes = provisional
        self._plan_text: str | None = None
        self._store: WindowStore | None = None
        self._aggregator: PartialAggregator | None = None
        self._announced: dict[int, int] = {}  # window start -> end, not yet emitted
        self._early = {e[0]: EarlyPart(*e[1:]) for e in metadata.early} if metadata else {}
        self._offsets = OffsetTracker()
        self._offsets.assign(partition, committed,
                             metadata.position if metadata is not None else None)
        self._emitted_through = None if metadata is None else metadata.frontier
        # Replayed records of windows at or before this were emitted before the restart.
        self._replay_until = metadata.position if metadata is not None else -1
        self._replayed_through = self._emitted_through
        self._late = _LatePartials()
        self._kept = None if revise_within_ms is None else KeptWindows(
            partition, revise_within_ms, metadata, merge_every=merge_every)

    # -- records in ----------------------------------------------------------------------

    def add_partial(self, offset: int, partial: Partial) -> None:
        """A ``partial`` record's state, or a ``values`` record's buffered rows."""
        end = partial.end_ms
        if self._emitted(end):
            self._add_emitted(offset, partial)
            return
        store, aggregator = self._store_for(partial.plan)
        if partial.kind == KIND_VALUES:
            store.add_values(partial.start_ms, end, pl.DataFrame(partial.state))
        else:
            state = aggregator.import_state(_uniform(pl.DataFrame(partial.state)))
            store.add(state, {partial.start_ms: end}, grouped=True, values={})
        self._announced[partial.start_ms] = end
        self._offsets.record(self.partition, offset, end)

    def _add_emitted(self, offset: int, partial: Partial) -> None:
        """A record of a window already emitted: a revision of it while it is kept (a
        replay's rebuild it), else, unless a replay's, late rows."""
        replayed, end = self._replayed(offset, partial.end_ms), partial.end_ms
        if self._kept is None or not self._kept.keeps(end):
            if not replayed:
                self._late.add(partial)
            self._offsets.record(self.partition, offset, NO_WINDOW)
            return
        self._store_for(partial.plan)  # the kept windows need the plan too
        frame = pl.DataFrame(partial.state)
        if partial.kind == KIND_VALUES:
            self._kept.add(partial.start_ms, end, values=frame, changed=not replayed)
        else:
            self._kept.add(partial.start_ms, end, state=_uniform(frame), changed=not replayed)
        self._offsets.record(self.partition, offset, end)  # done once the window expires

    def add_progress(self, offset: int, progress: ProgressRecord) -> None:
        self._reports.update(progress)
        waiting = [(s, e) for s, e in progress.windows if not self._emitted(e)]
        self._announced.update(waiting)
        self._offsets.record(self.partition, offset, max((e for _, e in waiting),
                                                         default=NO_WINDOW))

    def skip(self, offset: int) -> None:
        self._offsets.record(self.partition, offset, NO_WINDOW)

    def _emitted(self, end_ms: int) -> bool:
        return self._emitted_through is not None and end_ms <= self._emitted_through

    def _replayed(self, offset: int, end_ms: int) -> bool:
        return (offset < self._replay_until and self._replayed_through is not None
                and end_ms <= self._replayed_through)

    def _store_for(self, plan_text: str) -> tuple[WindowStore, PartialAggregator]:
        if self._store is None or self._aggregator is None or plan_text != self._plan_text:
            if self._store is not None and self._store.open_windows():
                raise ValueError("the aggregation plan changed while windows were open")
            self._plan_text = plan_text
            self._aggregator = _aggregator(plan_text)
            self._store = WindowStore(self._aggregator, merge_every=self._merge_every,
                                      track_changes=self._track_changes)
            if self._kept is not None:
                self._kept.use(self._aggregator)
        return self._store, self._aggregator

    def late_windows(self) -> list[ClosedWindow]:
        """The partials (and values) of windows already emitted that came since the last
        call (a partition added while running, say): finalized, for the late topic."""
        return self._late.take()

    # -- windows out ---------------------------------------------------------------------

    def close_due(self) -> list[Completed]:
        floor = self._reports.floor()
        if floor is None:
            return []
        due = sorted((s, e) for s, e in self._announced.items() if e <= floor)
        if not due:
            return []
        done = [Completed(start, end, window) for start, end, window in self._closed(floor, due)]
        for start, _ in due:
            del self._announced[start]
        self._emitted_through = floor if self._emitted_through is None \
            else max(floor, self._emitted_through)
        if self._kept is not None:
            self._kept.expire(floor)
        return done

    def _closed(self, floor: int, due: list[tuple[int, int]],
                ) -> list[tuple[int, int, ClosedWindow | None]]:
        """The due windows' final revisions (kept for revisions, with late: revise)."""
        if self._store is None:
            return [(start, end, None) for start, end in due]
        taken = self._store.take_closed(floor)
        closed = {w.start_ms: w for w in self._store.results(taken)}
        finals = {start: self._final(start, closed.get(start)) for start, _ in due}
        if self._kept is not None:
            self._kept.keep(taken, {s: w.revision for s, w in finals.items() if w is not None})
        return [(start, end, finals[start]) for start, end in due]

    def keys(self) -> tuple[str, ...]:
        """The plan's group keys (none before the first record)."""
        return () if self._aggregator is None else self._aggregator.plan.keys

    def revisions(self) -> list[ClosedWindow]:
        """The changed groups of kept windows, as this part's next revision of each."""
        return [] if self._kept is None else self._kept.revisions()

    def _final(self, start: int, window: ClosedWindow | None) -> ClosedWindow | None:
        """The closing revision: after early ones, the rows since the last of them."""
        early = self._early.get(start, EarlyPart())
        if window is None or early.next_revision == 0:
            return window
        return replace(window, revision=early.next_revision,
                       kind="delta" if early.emptied else "full")

    def emit_early(self) -> list[Completed]:
        """Every window held here as a non-final revision of this part, started afresh
        (the memory budget): the rows merged so far are then in emitted output, and
        their records need not be read again. Kept windows are dropped: later partials
        of them are late."""
        early = []
        if self._kept is not None:  # their revisions went out first (StageTwo.flush)
            self._kept.drop_all(self._emitted_through)
        for window in self._store.pop_all() if self._store is not None else []:
            revision = self._early.get(window.start_ms, EarlyPart()).next_revision
            early.append(Completed(window.start_ms, window.end_ms,
                                   replace(window, final=False, revision=revision,
                                           kind="delta")))
        self._offsets.mark_all_done()
        return early

    def provisional(self) -> list[ClosedWindow]:
        """Early results: the changed groups of every window merged here, as of now, each
        this part's next (provisional) revision; the windows stay."""
        out = []
        for window in [] if self._store is None else self._store.provisional():
            early = self._early.get(window.start_ms, EarlyPart())
            self._early[window.start_ms] = replace(early,
                                                   next_revision=early.next_revision + 1)
            out.append(replace(window, final=False, revision=early.next_revision,
                               kind="update"))
        return out

    def sent(self, start: int, *, messages: int, rows: int, input_rows: int,
             final: bool) -> EarlyPart:
        """Record what a revision of this part sent (final, or an early delta); the
        totals so far (once final, of the whole part, for its end-of-window marker)."""
        before = self._early.pop(start, EarlyPart())
        total = EarlyPart(before.next_revision + 1, before.messages + messages,
                          before.rows + rows, before.input_rows + input_rows,
                          before.emptied or int(not final))
        if not final:
            self._early[start] = total
        return total

    def buffered_values(self) -> int:
        kept = 0 if self._kept is None else self._kept.buffered_values()
        return kept + (0 if self._store is None else self._store.buffered_values())

    def commit_point(self) -> CommitPoint | None:
        retention = None if self._kept is None else self._kept.retention()
        point = self._offsets.commit_point(self.partition, self._emitted_through, None,
                                           retention=retention)
        if point is None or not self._early:
            return point
        early = tuple((start, e.next_revision, e.messages, e.rows, e.input_rows, e.emptied)
                      for start, e in sorted(self._early.items()))
        return replace(point, metadata=replace(point.metadata, early=early))

    def waiting(self) -> int:
        """Windows announced here and not yet complete."""
        return len(self._announced)

    def holding_back(self) -> list[PartitionKey]:
        return self._reports.holding_back() if self._announced else []

    def replaying(self) -> bool:
        next_offset = self._offsets.next_offset(self.partition)
        return self._replay_until >= 0 and (next_offset is None
                                            or next_offset < self._replay_until)

    def groups(self) -> int:
        kept = 0 if self._kept is None else self._kept.cardinality()
        return kept + (0 if self._store is None else self._store.cardinality())


class _LatePartials:
    """Records of windows already emitted, kept until the flush: a window's values come
    in records of their own after its state's, and are finalized with it."""

    def __init__(self) -> None:
        self._windows: dict[tuple[int, int, str], WindowStore] = {}

    def add(self, partial: Partial) -> None:
        key = (partial.start_ms, partial.end_ms, partial.plan)
        store = self._windows.get(key)
        if store is None:
            store = self._windows[key] = WindowStore(_aggregator(partial.plan), merge_every=1)
        if partial.kind == KIND_VALUES:
            store.add_values(partial.start_ms, partial.end_ms, pl.DataFrame(partial.state))
        else:
            aggregator = _aggregator(partial.plan)
            state = aggregator.import_state(_uniform(pl.DataFrame(partial.state)))
            store.add(state, {partial.start_ms: partial.end_ms}, grouped=True, values={})

    def take(self) -> list[ClosedWindow]:
        late = [w for store in self._windows.values() for w in store.pop_all()]
        self._windows.clear()
        return late


def _uniform(state: pl.DataFrame) -> pl.DataFrame:
    """Categorical keys as strings, whichever form an instance's first message had (each
    instance fixes its plan's types from its own first message), so that partials from
    every instance merge; the aggregator holds them as ids of its own."""
    categorical = [name for name, dtype in state.schema.items()
                   if isinstance(dtype, pl.Categorical | pl.Enum)]
    return state.with_columns(pl.col(categorical).cast(pl.String)) if categorical else state


def _aggregator(plan_text: str) -> PartialAggregator:
    plan = plan_from_text(plan_text)
    return PartialAggregator(plan, (WINDOW_START, *plan.keys))


def plan_from_text(plan_text: str) -> AggregationPlan:
    """The plan stage 1 wrote (consumer/core/scale_out/stage_one.py, ``plan_text``); its
    expressions are checked against the allowed language again, as any text is."""
    data = json.loads(plan_text)
    aggregates = tuple(ColumnAgg(a[0], a[1], a[2] if len(a) > 2 else None)
                       for a in data["aggregates"])
    expressions = tuple(ExpressionAgg(name, parse_expression(text))
                        for name, text in data.get("expressions", []))
    return AggregationPlan(keys=tuple(data["keys"]), aggregates=aggregates, skipped=(),
                           time_column=None, expressions=expressions)

