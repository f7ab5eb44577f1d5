"""Time windows: tumbling or hopping, by event time (a timestamp column, closed by the
watermark) or by processing time (the wall clock when the batch arrives).

Rows arrive with the coordinates of the messages they came from (``MessageRef``); the
engine keeps per-partition progress so that a replay after a restart or a takeover
skips what was emitted and calls late only what is (consumer/core/windows/frontier.py,
emitted_rows.py). With ``revise_within_ms`` (``window.late: revise``) emitted windows
are kept that long past their end (consumer/core/windows/time/retained.py), and late rows
within it revise them.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from consumer.core.aggregate import PartialAggregator
from consumer.core.offsets import (
    CommitMetadata,
    CommitPoint,
    OffsetTracker,
    Retention,
    owners_fingerprint,
)
from consumer.core.plan import AggregationPlan
from consumer.core.types import (
    NO_WINDOW,
    WINDOW_START,
    ClosedWindow,
    MessageRef,
    PartitionKey,
)
from consumer.core.windows.bounds import WindowSpec, to_epoch_ms, window_ranges, with_window_start
from consumer.core.windows.frontier import (
    PartitionFrontier,
    later,
    read_before_restart,
    settle_retention,
)
from consumer.core.windows.revisions import RevisionNumbers
from consumer.core.windows.store import Taken, WindowStore
from consumer.core.windows.time.emitted_rows import Bounds, emitted_bounds, mark_messages, sort_rows
from consumer.core.windows.time.late_partials import LatePartials
from consumer.core.windows.time.retained import RetainedWindows
from consumer.core.windows.watermark import WatermarkTracker

_EVENT_MS = "__event_ms"


class TimeWindowEngine:
    def __init__(
        self, plan: AggregationPlan, spec: WindowSpec, *, event_time: bool,
        time_dtype: pl.DataType | None, allowed_lateness_ms: int, idle_timeout_ms: int,
        merge_every: int, partials: bool = False, revise_within_ms: int | None = None,
        provisional: bool = False,
    ) -> None:
        """``partials``: closed windows hold their merged partial state instead of the
        results (stage 1 of the scale-out; consumer/core/scale_out/stage_one.py).
        ``revise_within_ms``: keep emitted windows this long past their end (event time,
        against the watermark) and revise them with late rows (None: late rows are late);
        with ``partials``, send such late rows on as partial states (late_partials.py).
        ``provisional``: note changed groups, for early results (``provisional``)."""
        if event_time and (plan.time_column is None or time_dtype is None):
            raise ValueError("event-time windows need the plan's time column and its dtype")
        if revise_within_ms is not None and not event_time:
            raise ValueError("revisions need event-time windows")
        self._plan = plan
        self._spec = spec
        self._event_time = event_time
        self._time_dtype = time_dtype
        self._aggregator = PartialAggregator(plan, (WINDOW_START, *plan.keys))
        self._partials = partials
        # Ends of windows stage 1 sent on while open (early results): they hold no state
        # here, but are open until closed, by the watermark or by all input going idle.
        self._sent_open: set[int] = set()
        self._store = WindowStore(self._aggregator, merge_every=merge_every,
                                  finalize=not partials, track_changes=provisional)
        self._offsets = OffsetTracker()
        self._watermarks = WatermarkTracker(
            allowed_lateness_ms=allowed_lateness_ms, idle_timeout_ms=idle_timeout_ms)
        self._progress: dict[PartitionKey, PartitionFrontier] = {}
        # The furthest this instance has closed windows (or a restored commit had): the
        # frontier of a partition that arrives with no commit of its own.
        self._closed_through: int | None = None
        self._numbers = RevisionNumbers()
        self._revise_within_ms = revise_within_ms
        revising = revise_within_ms is not None
        self._retained = RetainedWindows(plan, merge_every=merge_every) \
            if revising and not partials else None
        self._late_partials = LatePartials(self._aggregator) if revising and partials else None
        self._settled = True  # every assigned partition's retention is decided
        self.late_rows = 0
        self.revised_rows = 0
        self.skipped_replayed_rows = 0

    # -- assignment --------------------------------------------------------------------

    def assign(self, partition: PartitionKey, committed: int | None,
               metadata: CommitMetadata | None, now_ms: int) -> None:
        self._offsets.assign(partition, committed,
                             metadata.position if metadata is not None else None)
        if metadata is None or metadata.frontier is None:
            progress = PartitionFrontier(self._closed_through)
        else:
            progress = PartitionFrontier(metadata.frontier)
            self._closed_through = later(self._closed_through, metadata.frontier)
        if metadata is not None and self._event_time:
            progress.replay_until = metadata.position
            progress.replayed_frontier = metadata.frontier
            progress.restored_max_ms = metadata.max_event_ms
        progress.kept_after = progress.frontier
        if metadata is not None and metadata.retention is not None and self._retained:
            progress.restored = metadata.retention
            self._settled = False
        self._progress[partition] = progress
        self._watermarks.assign(partition, now_ms, None)
        self._end_replay_if_caught_up(partition, now_ms)

    def revoke(self, partition: PartitionKey) -> None:
        self._offsets.revoke(partition)
        self._watermarks.revoke(partition)
        self._progress.pop(partition, None)

    def _settle(self) -> None:
        if not self._settled and self._retained is not None:
            self._retained.restore(settle_retention(self._progress))
        self._settled = True

    def replaying(self, partition: PartitionKey) -> bool:
        """True until the partition has been re-read up to where the last run had got."""
        progress = self._progress.get(partition)
        if progress is None or progress.replay_until < 0:
            return False
        next_offset = self._offsets.next_offset(partition)
        return next_offset is None or next_offset < progress.replay_until

    def ahead_of_watermark(self, now_ms: int) -> list[PartitionKey]:
        """Partitions whose input fills windows the watermark cannot close yet."""
        return self._watermarks.ahead(now_ms) if self._event_time else []

    def _end_replay_if_caught_up(self, partition: PartitionKey, now_ms: int) -> None:
        progress = self._progress.get(partition)
        if progress is None or progress.restored_max_ms is None or self.replaying(partition):
            return
        self._watermarks.observe(partition, progress.restored_max_ms, now_ms, replayed=True)
        progress.restored_max_ms = None

    # -- rows in -----------------------------------------------------------------------

    def add(self, frame: pl.DataFrame, refs: Sequence[MessageRef],
            now_ms: int) -> pl.DataFrame | None:
        """Window and pre-aggregate ``frame``; return its late rows, with the window they
        were late for (``window_start``, ``window_end``) and the index in ``refs`` of the
        message each came from (``MESSAGE_INDEX``).

        Only messages that may hold rows of windows their partition already emitted are
        filtered row by row; in a steady stream that is none of them.
        """
        self._settle()
        bounds = [self._old_bounds(ref, now_ms) for ref in refs]
        late = None
        if any(b is not None for b in bounds):
            windowed, late = self._split_old(frame, refs, bounds, now_ms)
        else:
            windowed = self._windowed(frame.lazy(), now_ms)
        partial = self._aggregator.partial(windowed)
        starts = partial.get_column(WINDOW_START).unique().to_list()
        self._store.add(partial, {s: s + self._spec.size_ms for s in starts}, rows=windowed)
        for ref in refs:
            event_ms = ref.max_event_ms if self._event_time else now_ms
            self._offsets.record(ref.partition, ref.offset, self._last_end(event_ms))
            replayed = read_before_restart(self._progress.get(ref.partition), ref.offset)
            self._watermarks.observe(ref.partition, event_ms, now_ms, replayed=replayed)
            self._end_replay_if_caught_up(ref.partition, now_ms)
        return late

    def _windowed(self, frame: pl.LazyFrame, now_ms: int) -> pl.LazyFrame:
        with_event = frame.with_columns(self._event_expr(now_ms))
        return with_window_start(with_event, _EVENT_MS, self._spec).drop(_EVENT_MS)

    def _old_bounds(self, ref: MessageRef, now_ms: int) -> Bounds | None:
        """Where the message's rows of emitted windows go (emitted_rows.py), when it may
        hold any."""
        first_ms = ref.min_event_ms if self._event_time else now_ms
        return emitted_bounds(self._progress.get(ref.partition), ref, first_ms, self._spec,
                              revising=self._retained is not None,
                              open_within_ms=self._revise_within_ms if self._late_partials
                              else None)

    def _split_old(self, frame: pl.DataFrame, refs: Sequence[MessageRef],
                   bounds: list[Bounds | None], now_ms: int,
                   ) -> tuple[pl.LazyFrame, pl.DataFrame | None]:
        """Drop replayed rows of emitted windows; take out late rows; keep the rest.
        With late: revise, rows of kept windows go to them: a replay's rebuild them,
        late ones revise them."""
        marked = mark_messages(frame, refs, bounds)
        # Marked before windowing, so hopping windows repeat the marks with their row.
        rows = sort_rows(self._windowed(marked.lazy(), now_ms).collect(), self._spec.size_ms)
        self.skipped_replayed_rows += rows.skipped
        self.late_rows += rows.late.height
        self.revised_rows += rows.revising.height
        if self._retained is not None:
            self._retained.add(rows.rebuilding, self._ends(rows.rebuilding), changed=False)
            self._retained.add(rows.revising, self._ends(rows.revising), changed=True)
        elif self._late_partials is not None:  # a replay's went out before the restart
            self._late_partials.add(rows.revising, self._ends(rows.revising))
        return rows.rest.lazy(), (rows.late if rows.late.height else None)

    def _ends(self, rows: pl.DataFrame) -> dict[int, int]:
        return {s: s + self._spec.size_ms for s in rows[WINDOW_START].unique().to_list()}

    def keep_alive(self, partition: PartitionKey, now_ms: int) -> None:
        """The partition has a backlog not yet consumed: it is not idle."""
        self._watermarks.keep_alive(partition, now_ms)

    def skip(self, partition: PartitionKey, offset: int, now_ms: int) -> None:
        """A message with no usable rows: done at once, and proof the partition is alive."""
        self._offsets.record(partition, offset, NO_WINDOW)
        self._watermarks.observe(partition, None, now_ms)
        self._end_replay_if_caught_up(partition, now_ms)

    def _event_expr(self, now_ms: int) -> pl.Expr:
        if not self._event_time:
            return pl.lit(now_ms, pl.Int64).alias(_EVENT_MS)
        assert self._plan.time_column is not None  # noqa: S101 - checked in __init__
        assert self._time_dtype is not None  # noqa: S101
        return to_epoch_ms(self._plan.time_column, self._time_dtype).alias(_EVENT_MS)

    def _last_end(self, event_ms: int | None) -> int:
        if event_ms is None:
            return NO_WINDOW  # a message without rows feeds no window
        return window_ranges(event_ms, self._spec)[-1][1]

    # -- windows out -------------------------------------------------------------------

    def close_due(self, now_ms: int) -> list[ClosedWindow]:
        """The revisions due (late: revise), then the windows due to close. Revisions go
        first: their rows came before this close, which may end their windows' retention."""
        self._settle()
        revisions = self._revisions_due()
        return revisions + self._close_due(now_ms)

    def _close_due(self, now_ms: int) -> list[ClosedWindow]:
        if not self._event_time:
            return self._close_through(now_ms)
        watermark = self._watermarks.current(now_ms)
        if watermark.all_idle:
            # Nothing is coming: close every open window rather than wait forever. Event
            # time stands still, so kept windows stay kept.
            closed = self._closed(self._store.take(sorted(self._store.open_windows())))
            ends = [*(w.end_ms for w in closed), *self._sent_open]
            if ends:  # the windows sent on while open count: they are past too
                self._advance(max(ends))
            self._sent_open.clear()
            return closed
        if watermark.value_ms is None:
            return []
        return self._close_through(watermark.value_ms)

    def _close_through(self, through_ms: int) -> list[ClosedWindow]:
        # Pop by the watermark itself, not by the furthest close so far: a partition taken
        # over from another instance may reopen windows this one closed, and those close
        # again only when that partition's replay has passed them.
        closed = self._closed(self._store.take_closed(through_ms))
        self._advance(through_ms)
        self._sent_open = {end for end in self._sent_open if end > through_ms}
        if self._retained is not None and self._revise_within_ms is not None \
                and not self._holding():
            # Held revisions keep their windows (and no commit happens meanwhile).
            self._retained.expire(self._progress.values(), through_ms - self._revise_within_ms)
        return closed

    def _closed(self, taken: Taken) -> list[ClosedWindow]:
        closed = self._numbers.closing(self._store.results(taken))
        if self._retained is not None and taken.state is not None:
            self._retained.keep(taken, self._aggregator.export_state(taken.state),
                                {w.start_ms: w.revision for w in closed})
        return closed

    def _revisions_due(self) -> list[ClosedWindow]:
        if self._late_partials is not None:
            return self._late_partials.take()
        if self._retained is None or self._holding():
            return []
        return self._retained.revisions()

    def _holding(self) -> bool:
        """Revisions wait while a partition replays: its rows of the kept windows are not
        all back yet, and the revised groups would miss them."""
        return self._retained is not None and self._retained.changed() and any(
            map(self.replaying, self._progress))

    def _advance(self, through_ms: int) -> None:
        """Every assigned partition's rows up to ``through_ms`` are now emitted."""
        self._closed_through = later(self._closed_through, through_ms)
        for progress in self._progress.values():
            progress.frontier = later(progress.frontier, through_ms)

    # -- progress, for the scale-out's stage 1 -----------------------------------------

    def frontiers(self, now_ms: int) -> dict[PartitionKey, tuple[int | None, bool]]:
        """Each assigned partition's emitted frontier, and whether it is idle: quiet for
        the idle timeout *and* with nothing unsent. Stage 2 leaves an idle partition's
        frontier out of its floor, yet a quiet partition's rows may still wait here in
        open windows, held by another partition's watermark (one just taken over, whose
        restored frontier is past them, say): until they are sent it is not idle to
        stage 2, or the windows go out without them (as the session runs do)."""
        return {partition: (progress.frontier, self._watermarks.idle(partition, now_ms)
                            and not self._offsets.unsent(partition, progress.frontier))
                for partition, progress in self._progress.items()}

    def emit_early(self, now_ms: int) -> list[ClosedWindow]:  # noqa: ARG002
        """Emit every open window as a non-final revision and start them afresh, so the
        groups held stay within the memory budget; all consumed input is then emitted.
        Kept windows (late: revise) go first: their pending revisions out, their state
        dropped, and later rows of them are late."""
        early = self._numbers.early(self._store.pop_all())
        if self._partials:
            self._sent_open.update(w.end_ms for w in early)
        if self._late_partials is not None:
            early += self._late_partials.take()
        if self._retained is not None:
            early += self._retained.revisions()
            self._retained.drop_all()
            for progress in self._progress.values():
                progress.kept_after = progress.frontier
        self._offsets.mark_all_done()
        return early


    def provisional(self, now_ms: int) -> list[ClosedWindow]:  # noqa: ARG002
        """Early results (window.emit_every_ms): each open window's changed groups as of
        now, the windows unchanged. Stage 1 of the scale-out sends its whole state on
        instead (stage 2 has the results), and starts its windows afresh."""
        if self._partials:
            early = self._store.pop_all()
            self._sent_open.update(w.end_ms for w in early)
            self._offsets.mark_all_done()
            return early
        return self._numbers.provisional(self._store.provisional())

    def commit_points(self) -> dict[PartitionKey, CommitPoint] | None:
        """None while late rows wait for their revision (close_due emits it, unless a
        replay holds it back): a commit would record them as consumed, and after a
        crash their replay would rebuild the kept state without ever revising it."""
        self._settle()
        if self._retained is not None and self._retained.changed():
            return None
        points = {}
        owners = owners_fingerprint(self._progress)
        revisions = () if self._retained is None else self._retained.revision_numbers()
        for partition in self._offsets.partitions():
            progress = self._progress.get(partition) or PartitionFrontier(self._closed_through)
            seen = self._watermarks.max_event_ms(partition)
            retention = None if self._retained is None else Retention(
                progress.kept_after, owners, revisions)
            point = self._offsets.commit_point(
                partition, progress.frontier, later(seen, progress.restored_max_ms),
                retention=retention)
            if point is not None:
                points[partition] = point
        return points

    def discard(self) -> None:
        self._store.discard()
        if self._retained is not None:
            self._retained.drop_all()

    def cardinality(self) -> int:
        kept = 0 if self._retained is None else self._retained.cardinality()
        late = 0 if self._late_partials is None else self._late_partials.cardinality()
        return self._store.cardinality() + kept + late

    def merge_pending(self) -> None:
        self._store.merge_pending()
        if self._retained is not None:
            self._retained.merge_pending()

    def buffered_values(self) -> int:
        kept = 0 if self._retained is None else self._retained.buffered_values()
        return self._store.buffered_values() + kept

    def open_window_count(self) -> int:
        return len(self._store.open_windows())
