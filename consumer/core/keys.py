"""Group keys as the window state holds them.

String keys are held as ids: categoricals of the aggregator's own ``pl.Categories``,
4 bytes a key where Polars' string views take 16, and grouped like integers where a
merge by strings row-encodes every string. The strings come back only on the result
rows (``finalize``). Merging 1M + 800k state rows into 1M groups, four times over:
RSS +290 MB keyed by two strings, +180-230 MB by their ids (docs/benchmark-findings.md).

The categories are the aggregator's own, not Polars' global ones: Polars frees a
``Categories`` mapping once no data uses it, and this one is renewed from the live state
(``renew``) when it holds many more ids than the state has rows, so it stays
O(open groups) however the key values churn. Keys of any other type pass unchanged.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import polars as pl

# Renew the categories once they hold more than this many ids per live state row, plus
# a floor, so a renewal (O(state)) happens only after O(state) new key values.
_RENEW_PER_LIVE_ROW = 4
_RENEW_FROM_IDS = 100_000
_GENERATIONS = itertools.count()


class StateKeys:
    """The state's dtype for each group-by column, fixed by the first batch."""

    def __init__(self, group_by: Sequence[str]) -> None:
        self._group_by = tuple(group_by)
        self._dtypes: dict[str, pl.DataType] | None = None
        self._strings: tuple[str, ...] = ()  # the columns that arrive as String
        self._categories = _new_categories()
        self._ids = 0  # ids handed out by the current categories (an upper bound)

    def casts(self, schema: pl.Schema) -> list[pl.Expr]:
        """The casts that give a batch of this ``schema`` the state's key dtypes (the
        first batch's schema fixes them), to be applied inside the batch's query."""
        dtypes = self._dtypes if self._dtypes is not None else self._fix(schema)
        return [pl.col(name).cast(dtype) for name, dtype in dtypes.items()
                if schema[name] != dtype]

    def encode(self, state: pl.DataFrame) -> pl.DataFrame:
        """``state`` with its group-by columns in the state's dtypes."""
        casts = self.casts(state.schema)
        encoded = state.with_columns(casts) if casts else state
        self._count_ids(encoded)
        return encoded

    def decoded(self) -> list[pl.Expr]:
        """The group-by columns with string keys as strings again."""
        return [pl.col(name).cast(pl.String) if name in self._strings else pl.col(name)
                for name in self._group_by]

    def renewal_due(self, live_rows: int) -> bool:
        return self._ids > _RENEW_PER_LIVE_ROW * live_rows + _RENEW_FROM_IDS

    def renew(self, states: Sequence[pl.DataFrame]) -> list[pl.DataFrame]:
        """``states`` re-keyed into fresh categories; the old ones are freed with the
        last frame that uses them."""
        assert self._dtypes is not None  # noqa: S101 - ids exist only after encode()
        self._categories = _new_categories()
        self._ids = 0
        fresh = pl.Categorical(self._categories)
        self._dtypes.update(dict.fromkeys(self._strings, fresh))
        renewed = [s.with_columns(pl.col(self._strings).cast(pl.String).cast(fresh))
                   for s in states]
        for state in renewed:
            self._count_ids(state)
        return renewed

    def _fix(self, schema: pl.Schema) -> dict[str, pl.DataType]:
        self._strings = tuple(n for n in self._group_by if schema[n] == pl.String)
        ids = pl.Categorical(self._categories)
        self._dtypes = {n: ids if n in self._strings else schema[n] for n in self._group_by}
        return self._dtypes

    def _count_ids(self, state: pl.DataFrame) -> None:
        if not self._strings or state.height == 0:
            return
        tops = state.select(pl.col(self._strings).to_physical().max()).row(0)
        self._ids = max([self._ids, *(top + 1 for top in tops if top is not None)])


def _new_categories() -> pl.Categories:
    return pl.Categories(f"arrowagg.state-keys.{next(_GENERATIONS)}")
