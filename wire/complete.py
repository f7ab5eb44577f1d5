"""Whole windows from output messages, for subscribers: each window complete, and again
each time a revision changes it.

A window's results can arrive as several messages: chunks (``arrowagg.chunk: i/n``), early
revisions (``final: false``, deltas) and, with the scale-out, one part per repartition
partition (``arrowagg.part: k/n``), each part closed by an end-of-window marker that says
how many result rows and messages it has. ``WindowAssembler`` collects them and hands out
a window once all of it has arrived; ``consumer.kafka.tail.read_output(complete=True)``
uses it. With ``window.late: revise`` a closed window can later get update revisions
(``arrowagg.revision-kind: update``): once all chunks of one are in, its rows replace the
rows of the same keys in the window's closing revision and the window is handed out
again, whole, as of that revision: the latest supersedes. Provisional revisions (early
results: ``final: false`` updates of a window still open) are left out: the window's
closing revision is the whole of it. With the scale-out each part numbers its revisions
on its own (its keys are its own): an update is a repeat when its part has had that
revision or a later one. Session output (``arrowagg.window-kind: session``) goes to
``wire.sessions.SessionTable``, which holds the sessions and applies each revision,
saying which sessions it replaced; provisional sessions are left out too.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace

import polars as pl

from wire.output import FrontierMarker, OutputWindow, WindowEnd
from wire.sessions import SessionBatches, SessionTable

# Windows whose results are kept to apply update revisions to; an update of an older
# one is handed out as it is (its changed groups only, kind "update").
MAX_KEPT_WINDOWS = 10_000


@dataclass
class _Collected:
    end_ms: int
    data: dict[tuple[int | None, int, int], OutputWindow] = field(default_factory=dict)
    ends: dict[int, WindowEnd] = field(default_factory=dict)
    parts: int | None = None  # n of "part k of n", once a part has said it
    # Whole update revisions that came before the window was whole (with the scale-out a
    # part can be revised before another part has closed): applied once it is.
    updates: list[tuple[OutputWindow, pl.DataFrame]] = field(default_factory=list)


@dataclass
class _Whole:
    """A window handed out: its delta revisions before the closing one (added up by the
    subscriber), and the closing revision's rows, which updates replace by keys."""

    window: OutputWindow
    earlier: pl.DataFrame
    earlier_rows: int
    closing: pl.DataFrame
    applied: dict[int | None, int] = field(default_factory=dict)  # part -> last update


class WindowAssembler:
    def __init__(self, *, max_kept_windows: int = MAX_KEPT_WINDOWS) -> None:
        self._open: dict[int, _Collected] = {}
        self._done: set[int] = set()
        self._kept: OrderedDict[int, _Whole] = OrderedDict()
        self._max_kept = max_kept_windows
        self._updates: dict[tuple[int, int | None, int], dict[int, OutputWindow]] = {}
        self.sessions = SessionTable()
        self.session_batches = SessionBatches(self.sessions)

    def add(self, message: OutputWindow | WindowEnd | FrontierMarker) -> OutputWindow | None:
        """Take one decoded message; return its window when this message completes it
        (or completes an update revision of it). Session output: each revision once its
        chunks are in, applied to ``sessions``; with the scale-out, each part's batch
        once its frontier marker and all its messages are in."""
        if isinstance(message, FrontierMarker) or (
                isinstance(message, OutputWindow) and message.sessions):
            return self._session(message)
        if isinstance(message, OutputWindow) and message.kind == "update":
            # A provisional revision (early results) of a window still open says nothing
            # about the whole window: its closing revision does.
            return self._update(message) if message.final else None
        if message.start_ms in self._done:
            return None  # a repeat (at-least-once output), or a part already counted
        collected = self._open.setdefault(message.start_ms, _Collected(message.end_ms))
        if isinstance(message, WindowEnd):
            collected.ends[message.part[0]] = message
            collected.parts = message.part[1]
        else:
            part = None if message.part is None else message.part[0]
            collected.data[(part, message.revision, message.chunk[0])] = message
            if message.part is not None:
                collected.parts = message.part[1]
        if not self._complete(collected):
            return None
        del self._open[message.start_ms]
        self._done.add(message.start_ms)
        whole = _whole(message.start_ms, collected)
        self._keep(whole)
        latest = whole.window
        for update, rows in sorted(collected.updates, key=lambda u: u[0].revision):
            latest = self._apply(update, rows) or latest
        return latest

    def _session(self, message: OutputWindow | FrontierMarker) -> OutputWindow | None:
        if isinstance(message, FrontierMarker) or message.frontier_batch is not None:
            return self.session_batches.add(message)
        if not message.final and message.kind == "update":
            return None  # a provisional session (early results): its closing one says
        return self.sessions.add(message)

    def _complete(self, collected: _Collected) -> bool:
        if collected.parts is not None:  # the scale-out: every part ended, none short
            if len(collected.ends) < collected.parts:
                return False
            return all(sum(1 for (part, _, _) in collected.data if part == k) == end.messages
                       for k, end in collected.ends.items())
        finals = [w for w in collected.data.values() if w.final]
        if not finals:
            return False
        revision, chunks = finals[0].revision, finals[0].chunk[1]
        return all((None, revision, i) in collected.data for i in range(1, chunks + 1))

    def _keep(self, whole: _Whole) -> None:
        start = whole.window.start_ms
        self._kept[start] = whole
        self._kept.move_to_end(start)
        while len(self._kept) > self._max_kept:
            self._kept.popitem(last=False)

    def _update(self, message: OutputWindow) -> OutputWindow | None:
        part = None if message.part is None else message.part[0]
        key = (message.start_ms, part, message.revision)
        chunks = self._updates.setdefault(key, {})
        chunks[message.chunk[0]] = message
        if len(chunks) < message.chunk[1]:
            return None
        del self._updates[key]
        rows = _frame_of([chunks[i] for i in sorted(chunks)]) if message.frame.width else \
            message.frame
        if (collecting := self._open.get(message.start_ms)) is not None:
            collecting.updates.append((message, rows))  # applied once the window is whole
            return None
        return self._apply(message, rows)

    def _apply(self, message: OutputWindow, rows: pl.DataFrame) -> OutputWindow | None:
        """An update revision, all its chunks in (``rows``), applied to its window."""
        part = None if message.part is None else message.part[0]
        before = self._kept.get(message.start_ms)
        if before is None:  # never seen whole here (or long ago): the update as it is
            self._done.add(message.start_ms)
            return replace(message, chunk=(1, 1), frame=rows)
        last = before.applied.get(part, before.window.revision if part is None else 0)
        if message.revision <= last:
            return None  # a repeat of an update already applied
        closing = _replaced(before.closing, rows, message.keys or ())
        frames = [f for f in (before.earlier, closing) if f.height]
        whole = replace(before.window, revision=message.revision, chunk=(1, 1),
                        window_rows=before.earlier_rows + message.window_rows,
                        frame=pl.concat(frames, how="vertical_relaxed") if frames else closing)
        applied = {**before.applied, part: message.revision}
        self._keep(_Whole(whole, before.earlier, before.earlier_rows, closing, applied))
        return whole

    def pending(self) -> list[int]:
        """Starts of windows begun and not complete."""
        return sorted(self._open)


def _replaced(closing: pl.DataFrame, rows: pl.DataFrame, keys: tuple[str, ...],
              ) -> pl.DataFrame:
    """``closing`` with its rows of the keys in ``rows`` replaced by those rows."""
    if closing.height == 0:
        return rows
    on = ["window_start", *keys]
    kept = closing.join(rows.select(on), on=on, how="anti", nulls_equal=True,
                        maintain_order="left")
    return pl.concat([kept, rows], how="vertical_relaxed")


def _whole(start_ms: int, collected: _Collected) -> _Whole:
    messages = [collected.data[key] for key in sorted(collected.data, key=_order)]
    frames = [m.frame for m in messages if m.frame.height]
    frame = pl.concat(frames, how="vertical_relaxed") if frames else pl.DataFrame()
    if collected.ends:
        input_rows = sum(end.input_rows for end in collected.ends.values())
    else:
        input_rows = sum(m.window_rows for m in messages if m.chunk[0] == 1)
    closing_revision = max((m.revision for m in messages), default=0)
    closing = [m for m in messages if m.revision == closing_revision]
    earlier = [m for m in messages if m.revision != closing_revision]
    window = OutputWindow(start_ms, collected.end_ms, final=True, revision=closing_revision,
                          window_rows=input_rows, chunk=(1, 1), frame=frame,
                          kind="delta" if earlier else "full")
    return _Whole(window, _frame_of(earlier), sum(m.window_rows for m in earlier
                                                  if m.chunk[0] == 1), _frame_of(closing))


def _frame_of(messages: list[OutputWindow]) -> pl.DataFrame:
    frames = [m.frame for m in messages if m.frame.height]
    return pl.concat(frames, how="vertical_relaxed") if frames else pl.DataFrame()


def _order(key: tuple[int | None, int, int]) -> tuple[int, int, int]:
    part, revision, chunk = key
    return (part or 0, revision, chunk)
