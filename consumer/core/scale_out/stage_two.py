"""Stage 2 of the scale-out: the repartition partitions this instance owns, merged and
emitted as complete windows (consumer/core/scale_out/merge.py has the rules).

For each complete window, each repartition partition writes its part of the results
(``arrowagg.part: k/n``, every message ``final``) and then an end-of-window marker with
the part's row and message counts, so a subscriber knows when it has the whole window
(docs/wire-format.md). Session windows have no shared bounds: each partition writes the
sessions it completed and then a frontier marker (consumer/core/scale_out/session_merge.py);
with early results, then its open sessions that changed, provisional, outside any batch
(no marker counts them: they are not part of the output a subscriber waits to be whole).
One transaction holds them and the repartition offsets.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

from consumer.core.emit import OutputSpec, results_frame, window_bounds
from consumer.core.late import late_aggregate_records
from consumer.core.offsets import CommitMetadata, CommitPoint
from consumer.core.poll import Consumed, Counters, Processed
from consumer.core.scale_out.merge import Completed, MergeEngine
from consumer.core.scale_out.session_merge import SessionMergeEngine
from consumer.core.types import ClosedWindow, InputMessage, OutputRecord, PartitionKey
from consumer.core.windows.session.spans import SessionSpec
from wire.errors import ArrowaggError
from wire.output import (
    FrontierMarker,
    OutputMessage,
    WindowEnd,
    encode_frontier_marker,
    encode_window,
    encode_window_end,
)
from wire.repartition import (
    KIND_PARTIAL,
    KIND_VALUES,
    decode_partial,
    decode_progress,
    record_kind,
)

log = logging.getLogger(__name__)


class StageTwo:
    def __init__(self, routes: OutputSpec, *, partitions: int, inputs: set[PartitionKey],
                 merge_every: int, counters: Counters,
                 budget: tuple[int, int] | None = None,
                 revise_within_ms: int | None = None, emit_every_ms: int | None = None,
                 sessions: SessionSpec | None = None) -> None:
        """``partitions``: the repartition topic's partition count (n in "part k of n");
        ``inputs``: the input partitions known at start (more are learnt from reports);
        ``budget``: the groups and buffered values stage 2 may hold (input.max_groups,
        input.max_buffered_values) before it emits its windows early; ``sessions``:
        session windows (each partition then merges partial sessions)."""
        self._routes = routes
        self._parts = partitions
        self._inputs = inputs
        self._merge_every = merge_every
        self.counters = counters
        self._budget = budget
        self._revise_within_ms = revise_within_ms
        self._emit_every_ms = emit_every_ms  # early results this often (None: none)
        self._last_provisional_ms: int | None = None
        self._sessions = sessions
        self._engines: dict[PartitionKey, MergeEngine | SessionMergeEngine] = {}
        self._pending: list[OutputRecord] = []
        # A session part's output while it cannot commit (a reopened session waits):
        # sent with its offsets, never before them.
        self._held: dict[PartitionKey, list[OutputRecord]] = {}
        self._said_sessions_over = False  # said once each time sessions go over the budget

    # -- partitions ----------------------------------------------------------------------

    def assign(self, partition: PartitionKey, committed: int | None,
               metadata: CommitMetadata | None) -> None:
        if self._sessions is not None:
            self._engines[partition] = SessionMergeEngine(
                partition, self._inputs, self._sessions, committed=committed,
                metadata=metadata, provisional=self._emit_every_ms is not None,
                revise_within_ms=self._revise_within_ms)
            return
        self._engines[partition] = MergeEngine(partition, self._inputs, committed=committed,
                                               metadata=metadata,
                                               merge_every=self._merge_every,
                                               revise_within_ms=self._revise_within_ms,
                                               provisional=self._emit_every_ms is not None)

    def revoke(self, partition: PartitionKey) -> None:
        self._engines.pop(partition, None)
        self._held.pop(partition, None)

    def restart(self, committed: Mapping[PartitionKey, tuple[int | None, CommitMetadata | None]],
                ) -> dict[PartitionKey, int | None]:
        """Forget every partition's state; start again from ``committed``."""
        self._pending.clear()
        self._held.clear()
        self._engines.clear()
        for partition, (offset, metadata) in committed.items():
            self.assign(partition, offset, metadata)
        return {partition: offset for partition, (offset, _) in committed.items()}

    # -- records in ----------------------------------------------------------------------

    def process(self, messages: Sequence[InputMessage]) -> Processed:
        consumed = []
        for message in messages:
            engine = self._engines.get(message.partition)
            if engine is None:
                continue  # revoked while the poll was under way
            try:
                if record_kind(message.headers) in (KIND_PARTIAL, KIND_VALUES):
                    partial = decode_partial(message.value, message.headers)
                    engine.add_partial(message.offset, partial)
                    states = partial.state.num_rows if partial.kind == KIND_PARTIAL else 0
                    consumed.append(Consumed(message.partition, states,
                                             len(message.value or b"")))
                else:
                    engine.add_progress(message.offset, decode_progress(message.value))
            except ArrowaggError as err:  # not ours: the topic is shared with something else
                log.warning("skipped %s[%d]@%d on the repartition topic: %s",
                            *message.partition, message.offset, err)
                engine.skip(message.offset)
        return Processed(consumed=consumed)

    # -- records out ---------------------------------------------------------------------

    def flush(self, now_ms: int) -> tuple[list[OutputRecord], dict[PartitionKey, CommitPoint],
                                          list[ClosedWindow]]:
        """Complete windows' records (added to what waits for a commit), the commit points
        of the repartition partitions, and the windows completed."""
        windows: list[ClosedWindow] = []
        over = self._over_budget()
        provisional = self._provisional_due(now_ms)
        for partition, engine in sorted(self._engines.items()):
            if isinstance(engine, SessionMergeEngine):
                held = self._held.setdefault(partition, [])
                held += self._session_records(engine, windows, provisional=provisional)
                if not engine.reopened():
                    self._pending += self._held.pop(partition)
                continue
            # Revisions first: their partials came before this close, which may end
            # their windows' retention.
            self._pending += [r for w in engine.revisions() for r in self._update(engine, w)]
            self._pending += [r for w in (engine.provisional() if provisional else [])
                              for r in self._update(engine, w)]
            for done in engine.emit_early() if over else []:
                self._pending += self._part_records(engine, done)
            for done in engine.close_due():
                self._pending += self._part_records(engine, done)
                if done.window is not None:
                    windows.append(done.window)
            for late in engine.late_windows():
                self._pending += self._late_records(late)
        points = {p: point for p, e in self._engines.items()
                  if (point := e.commit_point()) is not None}
        return list(self._pending), points, windows

    def committed(self, records: int) -> None:
        self._pending = self._pending[records:]

    def _provisional_due(self, now_ms: int) -> bool:
        every, last = self._emit_every_ms, self._last_provisional_ms
        if every is None or (last is not None and now_ms - last < every):
            return False
        self._last_provisional_ms = now_ms
        return True

    def _over_budget(self) -> bool:
        if self._budget is None:
            return False
        max_groups, max_values = self._budget
        groups = sum(e.groups() for e in self._engines.values())
        values = sum(e.buffered_values() for e in self._engines.values())
        if groups < max_groups and values < max_values:
            self._said_sessions_over = False
            return False
        if self._sessions is not None:
            # A session can go out early on one instance, whose rows it holds; here it is
            # partial until every instance has sent its part, so it stays (design.md).
            if not self._said_sessions_over:
                log.warning("stage 2 holds %d sessions and %d buffered values, over "
                            "input.max_groups or input.max_buffered_values: it keeps them, "
                            "since a session goes out of stage 2 only once complete",
                            groups, values)
                self._said_sessions_over = True
            return False
        # Stage 2 cannot pause: a window completes only once the progress records behind
        # its partials are read, from the same partitions.
        log.warning("stage 2 holds %d groups and %d buffered values (input.max_groups, "
                    "input.max_buffered_values): emitting its windows early", groups, values)
        return True

    def _part_records(self, engine: MergeEngine, done: Completed) -> list[OutputRecord]:
        """This part's messages of the window; once final, its end-of-window marker,
        counting the early revisions' messages too."""
        routes, window = self._routes, done.window
        part = (engine.partition[1] + 1, self._parts)
        data = []
        if window is not None:
            data = encode_window(results_frame(window, routes), start_ms=done.start_ms,
                                 end_ms=done.end_ms,
                                 input_rows=window.input_rows, fmt=routes.output_format,
                                 compression=routes.compression,
                                 max_bytes=routes.max_message_bytes, part=part,
                                 revision=window.revision, final=window.final,
                                 kind=window.kind)
        final = window is None or window.final
        sent = engine.sent(done.start_ms, messages=len(data),
                           rows=0 if window is None else window.frame.height,
                           input_rows=0 if window is None else window.input_rows, final=final)
        if not final:
            return [OutputRecord(routes.output_topic, m.key, m.value, m.headers) for m in data]
        end = encode_window_end(WindowEnd(done.start_ms, done.end_ms, part, sent.rows,
                                          sent.messages, sent.input_rows))
        return [OutputRecord(routes.output_topic, m.key, m.value, m.headers)
                for m in [*data, end]]

    def _session_records(self, engine: SessionMergeEngine, windows: list[ClosedWindow], *,
                         provisional: bool) -> list[OutputRecord]:
        """The sessions this partition completed, each message naming the frontier marker
        that follows them; the marker, when its frontier moved; late partial sessions;
        with ``provisional``, the open sessions that changed (early results)."""
        routes, part = self._routes, (engine.partition[1] + 1, self._parts)
        records = [r for late in engine.late_windows() for r in self._late_records(late)]
        messages = []
        if (done := engine.close_due()) is not None:
            closed, through = done
            messages = [m for window in closed
                        for m in self._session_messages(engine, window, through)]
            messages.append(encode_frontier_marker(FrontierMarker(
                through, part, sum(w.frame.height for w in closed), len(messages),
                sum(w.input_rows for w in closed))))
            windows += closed
        # After the close: a session closing now goes out once, final.
        messages += [m for window in (engine.provisional() if provisional else [])
                     for m in self._session_messages(engine, window, None)]
        # A provisional session is superseded by a later row covering its start, and a
        # revision replaces emitted sessions (late: revise), which may be in another
        # message under another key: then one output partition keeps the order they must
        # be applied in (as on one instance).
        in_order = self._emit_every_ms is not None or self._revise_within_ms is not None
        partition = 0 if in_order else None
        return [*records, *(OutputRecord(routes.output_topic, m.key, m.value, m.headers,
                                         partition) for m in messages)]

    def _session_messages(self, engine: SessionMergeEngine, window: ClosedWindow,
                          batch: int | None) -> list[OutputMessage]:
        """``window``'s sessions, in the frontier batch ``batch`` (None: provisional ones,
        in none)."""
        routes = self._routes
        return encode_window(
            results_frame(window, routes), start_ms=window.start_ms, end_ms=window.end_ms,
            input_rows=window.input_rows, fmt=routes.output_format,
            compression=routes.compression, max_bytes=routes.max_message_bytes,
            part=(engine.partition[1] + 1, self._parts), revision=window.revision,
            final=window.final, kind=window.kind, keys=engine.keys(), sessions=True,
            frontier_batch=batch)

    def _update(self, engine: MergeEngine, window: ClosedWindow) -> list[OutputRecord]:
        """The changed groups' results as this part's next revision of a window: of one
        already out (window.late: revise), or a provisional one of one still open (early
        results, not final)."""
        routes = self._routes
        messages = encode_window(results_frame(window, routes), start_ms=window.start_ms,
                                 end_ms=window.end_ms,
                                 input_rows=window.input_rows, fmt=routes.output_format,
                                 compression=routes.compression,
                                 max_bytes=routes.max_message_bytes,
                                 part=(engine.partition[1] + 1, self._parts),
                                 revision=window.revision, kind=window.kind,
                                 final=window.final, keys=engine.keys())
        return [OutputRecord(routes.output_topic, m.key, m.value, m.headers) for m in messages]

    def _late_records(self, late: ClosedWindow) -> list[OutputRecord]:
        self.counters.late_rows += late.input_rows
        log.warning("partials of window %s arrived after it was emitted: %d input rows late",
                    window_bounds(late.start_ms, late.end_ms), late.input_rows)
        topic = self._routes.late_topic
        if topic is None:
            return []
        return late_aggregate_records(late, topic=topic, compression=self._routes.compression,
                                      max_bytes=self._routes.max_message_bytes)

    # -- state ---------------------------------------------------------------------------

    def assigned(self) -> Iterable[PartitionKey]:
        return self._engines.keys()

    def replaying(self) -> bool:
        return any(e.replaying() for e in self._engines.values())

    def waiting(self) -> int:
        return sum(e.waiting() for e in self._engines.values())

    def holding_back(self) -> list[PartitionKey]:
        return sorted({p for e in self._engines.values() for p in e.holding_back()})

    def groups(self) -> int:
        return sum(e.groups() for e in self._engines.values())

    def buffered_values(self) -> int:
        """Values held for aggregates that do not decompose (input.max_buffered_values)."""
        return sum(e.buffered_values() for e in self._engines.values())

    def pending_records(self) -> int:
        return len(self._pending)
