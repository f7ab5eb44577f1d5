"""StateKeys: string keys held as ids of the aggregator's own categories, renewed."""

from __future__ import annotations

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from consumer.core import keys
from consumer.core.keys import StateKeys


def batch(first: int, count: int) -> pl.DataFrame:
    ordinal = pl.int_range(first, first + count, eager=True)
    return pl.DataFrame({
        "window_start": ordinal // 10,
        "k": pl.Series([None if i % 7 == 0 else f"key-{i}" for i in ordinal]),
        "c": pl.Series([f"c{i % 3}" for i in ordinal]).cast(pl.Categorical),
        "v": ordinal,
    })


def decoded(state_keys: StateKeys, state: pl.DataFrame) -> pl.DataFrame:
    return state.select(*state_keys.decoded(), "v")


def test_strings_become_ids_and_come_back_other_keys_untouched() -> None:
    state_keys = StateKeys(("window_start", "k", "c"))
    frame = batch(0, 50)
    encoded = state_keys.encode(frame)
    assert isinstance(encoded.schema["k"], pl.Categorical)
    assert encoded.schema["k"] != pl.Categorical()  # its own categories, not the global ones
    assert encoded.schema["c"] == frame.schema["c"]
    assert encoded.schema["window_start"] == frame.schema["window_start"]
    assert_frame_equal(decoded(state_keys, encoded), frame)


def test_later_batches_take_the_first_batchs_key_types() -> None:
    state_keys = StateKeys(("window_start", "k", "c"))
    first = state_keys.encode(batch(0, 20))
    # the same key sent dictionary-encoded, and the categorical one sent plain
    later = batch(10, 20).with_columns(pl.col("k").cast(pl.Categorical),
                                       pl.col("c").cast(pl.String))
    encoded = state_keys.encode(later)
    assert encoded.schema == first.schema
    both = pl.concat([first, encoded])  # one state dtype: the frames concatenate
    expected = pl.concat([batch(0, 20), batch(10, 20)])
    assert_frame_equal(decoded(state_keys, both), expected)


def test_renewal_keeps_values_and_drops_dead_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keys, "_RENEW_FROM_IDS", 100)
    state_keys = StateKeys(("window_start", "k", "c"))
    live = state_keys.encode(batch(0, 10))
    for first in range(1_000, 5_000, 1_000):  # churn: every batch brings new key values
        state_keys.encode(batch(first, 1_000))
    assert state_keys.renewal_due(live.height)
    (renewed,) = state_keys.renew([live])
    assert not state_keys.renewal_due(live.height)
    assert renewed.schema["k"] != live.schema["k"]  # fresh categories
    distinct = live.get_column("k").drop_nulls().n_unique()
    assert renewed.get_column("k").to_physical().max() == distinct - 1  # ids 0..distinct-1
    assert_frame_equal(decoded(state_keys, renewed), batch(0, 10))
    # new batches use the fresh categories, so they merge with the renewed state
    later = state_keys.encode(batch(5, 10))
    assert later.schema == renewed.schema


def test_no_string_keys_no_ids() -> None:
    state_keys = StateKeys(("window_start", "c"))
    frame = batch(0, 30).drop("k")
    assert state_keys.encode(frame) is frame
    assert not state_keys.renewal_due(0)
