"""Stage 1 of the scale-out with ``window.late: revise``: late rows of windows still open
to revisions, sent on as partial states.

Stage 2 keeps the emitted windows (it merged them; consumer/core/scale_out/merge.py) and
revises them; stage 1 keeps nothing. A late row whose window ends within
``revision_lateness_ms`` of its partition's frontier is pre-aggregated here and goes out
with the next flush as a partial state of that window, in the same transaction as the
offset that passes it (so once); rows later than that stay late, for the late topic. A
replay skips the rows of messages read before the restart, as it skips their late rows:
what they became went out with those messages' commit.
"""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

from consumer.core.aggregate import PartialAggregator
from consumer.core.types import WINDOW_START, ClosedWindow
from consumer.core.windows.store import WindowStore


class LatePartials:
    def __init__(self, aggregator: PartialAggregator) -> None:
        # An aggregator of its own: its key ids are renewed apart from the open windows'.
        self._aggregator = PartialAggregator(aggregator.plan, aggregator.group_by)
        self._store = WindowStore(self._aggregator, merge_every=1, finalize=False)

    def add(self, rows: pl.DataFrame, ends: Mapping[int, int]) -> None:
        """Late rows (windowed) of windows open to revisions."""
        if rows.height == 0:
            return
        present = {int(s): ends[int(s)] for s in rows[WINDOW_START].unique().to_list()}
        self._store.add(self._aggregator.partial(rows.lazy()), present, rows=rows.lazy())

    def take(self) -> list[ClosedWindow]:
        """The partial states gathered since the last call, a closed window each."""
        return self._store.pop_all()

    def cardinality(self) -> int:
        return self._store.cardinality()
