"""Whole windows from output messages, for subscribers: each window once, complete.

A window's results can arrive as several messages: chunks (``arrowagg.chunk: i/n``), early
revisions (``final: false``) and, with the scale-out, one part per repartition partition
(``arrowagg.part: k/n``), each part closed by an end-of-window marker that says how many
result rows and messages it has. ``WindowAssembler`` collects them and hands out a
window once all of it has arrived; ``consumer.kafka.tail.read_output(complete=True)``
uses it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from wire.output import OutputWindow, WindowEnd


@dataclass
class _Collected:
    end_ms: int
    data: dict[tuple[int | None, int, int], OutputWindow] = field(default_factory=dict)
    ends: dict[int, WindowEnd] = field(default_factory=dict)
    parts: int | None = None  # n of "part k of n", once a part has said it


class WindowAssembler:
    def __init__(self) -> None:
        self._open: dict[int, _Collected] = {}
        self._done: set[int] = set()

    def add(self, message: OutputWindow | WindowEnd) -> OutputWindow | None:
        """Take one decoded message; return its window when this message completes it."""
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
        return _whole(message.start_ms, collected)

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

    def pending(self) -> list[int]:
        """Starts of windows begun and not complete."""
        return sorted(self._open)


def _whole(start_ms: int, collected: _Collected) -> OutputWindow:
    messages = [collected.data[key] for key in sorted(collected.data, key=_order)]
    frames = [m.frame for m in messages if m.frame.height]
    frame = pl.concat(frames, how="vertical_relaxed") if frames else pl.DataFrame()
    if collected.ends:
        input_rows = sum(end.input_rows for end in collected.ends.values())
    else:
        input_rows = sum(m.window_rows for m in messages if m.chunk[0] == 1)
    return OutputWindow(start_ms, collected.end_ms, final=True, revision=max(
        (m.revision for m in messages), default=0), window_rows=input_rows, chunk=(1, 1),
        frame=frame)


def _order(key: tuple[int | None, int, int]) -> tuple[int, int, int]:
    part, revision, chunk = key
    return (part or 0, revision, chunk)
