"""Stage 2 of the scale-out with ``window.late: revise``: emitted windows kept for
revisions, per repartition partition.

A window completed here keeps its merged state (consumer/core/windows/time/retained.py)
until the floor passes its end plus ``revision_lateness_ms``. Partial states stage 1
sends for it meanwhile (late rows it found: consumer/core/windows/time/late_partials.py)
merge into it, and each changed group's new results go out as the part's next revision
(``kind: update``, numbered on per part). The state lives only in memory: the committed
repartition offset stays at the first record of a kept window (``Retention.through``), so
a replay rebuilds it, and the commit metadata carries the revision numbers.
"""

from __future__ import annotations

import polars as pl

from consumer.core.aggregate import PartialAggregator
from consumer.core.offsets import CommitMetadata, Retention, owners_fingerprint
from consumer.core.types import ClosedWindow, PartitionKey
from consumer.core.windows.store import Taken
from consumer.core.windows.time.retained import RetainedWindows


class KeptWindows:
    def __init__(self, partition: PartitionKey, revise_within_ms: int,
                 metadata: CommitMetadata | None, *, merge_every: int) -> None:
        self._owner = owners_fingerprint([partition])
        self._within_ms = revise_within_ms
        self._merge_every = merge_every
        retention = None if metadata is None else metadata.retention
        # Windows ending at or before this are past their revisions (None: none is).
        self.through = None if retention is None else retention.through
        self._restored = dict(retention.revisions) if retention is not None else {}
        self._retained: RetainedWindows | None = None
        self._aggregator: PartialAggregator | None = None

    def use(self, aggregator: PartialAggregator) -> None:
        """The plan's aggregator (stage 2 learns the plan from the first record)."""
        if self._aggregator is None or aggregator.plan != self._aggregator.plan:
            self._aggregator = aggregator
            self._retained = RetainedWindows(aggregator.plan, merge_every=self._merge_every)
            self._retained.restore(self._restored)

    def keeps(self, end_ms: int) -> bool:
        """Whether an emitted window ending at ``end_ms`` is still open to revisions."""
        return self.through is None or end_ms > self.through

    def keep(self, taken: Taken, revisions: dict[int, int]) -> None:
        """Windows just completed here, with the revision each went out as."""
        if self._retained is None or self._aggregator is None or taken.state is None:
            return
        self._retained.keep(taken, self._aggregator.export_state(taken.state), revisions)

    def add(self, start: int, end: int, *, state: pl.DataFrame | None = None,
            values: pl.DataFrame | None = None, changed: bool) -> None:
        """An emitted, kept window's partial state or values: a replay's (rebuilding it)
        or stage 1's late ones (``changed``: a revision is due)."""
        if self._retained is not None:
            self._retained.add_state(start, end, state=state, values=values, changed=changed)

    def revisions(self) -> list[ClosedWindow]:
        return [] if self._retained is None else self._retained.revisions()

    def expire(self, floor_ms: int) -> None:
        """Windows ending ``revision_lateness_ms`` or more before the floor are done."""
        through = floor_ms - self._within_ms
        if self.through is None or through > self.through:
            self.through = through
            if self._retained is not None:
                self._retained.drop_through(through)

    def drop_all(self, through_ms: int | None) -> None:
        """Forget every kept window (the memory budget): later partials of them are late."""
        if self._retained is not None:
            self._retained.drop_all()
        if through_ms is not None and (self.through is None or through_ms > self.through):
            self.through = through_ms

    def retention(self) -> Retention:
        revisions = () if self._retained is None else self._retained.revision_numbers()
        return Retention(self.through, self._owner, revisions)

    def cardinality(self) -> int:
        return 0 if self._retained is None else self._retained.cardinality()

    def buffered_values(self) -> int:
        return 0 if self._retained is None else self._retained.buffered_values()
