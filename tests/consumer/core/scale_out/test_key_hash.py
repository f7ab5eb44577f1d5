"""The scale-out's key hash is stable: spelled-out FNV-1a over canonical key text."""

from __future__ import annotations

import polars as pl
from hypothesis import given
from hypothesis import strategies as st

from consumer.core.scale_out.key_hash import fnv1a, key_text, partition_of


def fnv1a_reference(data: bytes) -> int:
    value = 0xCBF29CE484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001B3) % 2**64
    return value


def test_published_fnv1a_test_vectors() -> None:
    # From the FNV reference: fnv1a64("") and fnv1a64("a"), "foobar".
    hashes = fnv1a(pl.Series(["", "a", "foobar"]))
    assert [int(h) for h in hashes] == [0xCBF29CE484222325, 0xAF63DC4C8601EC8C,
                                        0x85944171F73967E8]


@given(st.lists(st.text(max_size=40), max_size=50))
def test_the_vectorised_hash_is_the_byte_by_byte_one(texts: list[str]) -> None:
    assert [int(h) for h in fnv1a(pl.Series(texts, dtype=pl.String))] == [
        fnv1a_reference(t.encode()) for t in texts]


def test_equal_keys_of_other_types_go_to_the_same_partition() -> None:
    plain = pl.DataFrame({"site": ["a", None, "b"],
                          "ts": pl.Series([1_000, 2_000, 3_000]).cast(pl.Datetime("ms", "UTC")),
                          "n": pl.Series([1, 2, None], dtype=pl.Int32)})
    other = plain.with_columns(pl.col("site").cast(pl.Categorical),
                               pl.col("ts").cast(pl.Datetime("us")),
                               pl.col("n").cast(pl.Int64))
    keys = ["site", "ts", "n"]
    assert key_text(plain, keys).to_list() == key_text(other, keys).to_list() == [
        "a\x1f1000000\x1f1", "\x00\x1f2000000\x1f2", "b\x1f3000000\x1f\x00"]
    assert partition_of(plain, keys, 7).to_list() == partition_of(other, keys, 7).to_list()


def test_partitions_are_in_range_and_spread() -> None:
    frame = pl.DataFrame({"k": [f"key-{i}" for i in range(6_000)]})
    parts = partition_of(frame, ["k"], 6)
    counts = parts.value_counts().sort("partition")
    assert counts["partition"].to_list() == list(range(6))
    assert all(count > 800 for count in counts["count"].to_list())  # roughly 1,000 each


def test_no_keys_means_one_partition_for_the_window() -> None:
    frame = pl.DataFrame({"v": [1.0, 2.0]})
    assert partition_of(frame, [], 5).n_unique() == 1
