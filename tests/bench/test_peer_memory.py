"""The memory runs' slices and how their steady RSS is read, without a broker."""

from __future__ import annotations

import polars as pl
import pytest

from bench import peer_data
from bench.payloads import START_MS, WINDOW_MS
from bench.peer_memory import per_group, slice_payloads, steady_rss


def test_every_window_holds_every_group() -> None:
    payloads = slice_payloads(groups=300, windows=2, rows_per_window=1_200)
    expected = peer_data.reference(payloads)
    assert payloads.rows == 2_400
    per_window = expected.group_by("window_start").agg(pl.len(), pl.col("row_count").sum())
    assert per_window.sort("window_start").rows() == [(START_MS, 300, 1_200),
                                                       (START_MS + WINDOW_MS, 300, 1_200)]


def test_a_group_a_row_at_the_highest_cardinality() -> None:
    payloads = slice_payloads(groups=30_000, windows=1, rows_per_window=30_000)
    assert len(payloads.values) == 3  # messages of at most 10,000 rows, under 1 MB
    expected = peer_data.reference(payloads)
    assert expected.height == 30_000
    assert set(expected["row_count"].to_list()) == {1}


def test_a_window_in_whole_messages_holding_every_group() -> None:
    with pytest.raises(ValueError, match="not whole messages"):
        slice_payloads(groups=100, windows=1, rows_per_window=25_000)
    with pytest.raises(ValueError, match="fewer than the 2,000 groups"):
        slice_payloads(groups=2_000, windows=1, rows_per_window=1_000)


def test_the_steady_rss_is_the_second_halfs_median() -> None:
    samples = [(t, kb) for t, kb in zip(range(11), [10, 50, 400, 60, 70, 80, 90, 100,
                                                     110, 120, 999], strict=True)]
    # first input at 1, last result at 9: the second half is 5..9
    got = steady_rss([(float(t), kb * 1024) for t, kb in samples], 1.0, 9.0)
    assert got == {"steady_rss_mb": 100.0, "peak_rss_mb": 400.0}  # 80, 90, 100, 110, 120


def test_a_run_shorter_than_a_sample_reads_the_last_one_before_its_end() -> None:
    got = steady_rss([(0.0, 1024), (0.2, 2048), (0.4, 4096)], 0.25, 0.3)
    assert got == {"steady_rss_mb": 2.0, "peak_rss_mb": 2.0}


def test_bytes_per_group_between_the_two_cardinalities() -> None:
    runs = [{"groups": 10_000, "steady_rss_mb": 300.0},
            {"groups": 1_010_000, "steady_rss_mb": 300.0 + 1_000_000 * 200 / 2**20}]
    assert per_group(runs) == {"bytes_per_group": 200.0}
    assert per_group([runs[0], {"groups": 1, "wrong": "3 missing"}]) == {"wrong": "3 missing"}
