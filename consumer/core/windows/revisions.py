"""How a window's revisions are numbered and what each holds, while it is open.

A window can go out before it closes, two ways: a provisional revision (early results,
``window.emit_every_ms``: the changed groups with their whole current values, kind
``update``; the window stays as it is) and an early revision (the memory budget: the rows
since the last one, kind ``delta``; the window starts afresh). Either takes the window's
next number; so does its closing revision, which is ``full`` unless an early revision
took rows out of it (then ``delta``: a subscriber adds the deltas up).
"""

from __future__ import annotations

from dataclasses import replace

from consumer.core.types import ClosedWindow


class RevisionNumbers:
    def __init__(self) -> None:
        self._next: dict[int, int] = {}  # window start -> next revision number
        self._emptied: set[int] = set()  # windows an early revision started afresh

    def provisional(self, windows: list[ClosedWindow]) -> list[ClosedWindow]:
        return [replace(w, final=False, revision=self._take(w.start_ms), kind="update")
                for w in windows]

    def early(self, windows: list[ClosedWindow]) -> list[ClosedWindow]:
        self._emptied.update(w.start_ms for w in windows)
        return [replace(w, final=False, revision=self._take(w.start_ms), kind="delta")
                for w in windows]

    def closing(self, windows: list[ClosedWindow]) -> list[ClosedWindow]:
        out = []
        for window in windows:
            start = window.start_ms
            emptied = start in self._emptied
            self._emptied.discard(start)
            out.append(replace(window, final=True, revision=self._next.pop(start, 0),
                               kind="delta" if emptied else "full"))
        return out

    def _take(self, start: int) -> int:
        revision = self._next.get(start, 0)
        self._next[start] = revision + 1
        return revision
