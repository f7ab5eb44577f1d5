"""Purging Polars' jemalloc after merges: the instrument works, and so does the experiment."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench.research import jemalloc, purge
from consumer.core.aggregate import PartialAggregator


def test_jemalloc_answers_through_the_resolved_mallctl() -> None:
    assert jemalloc.version().split(".")[0] == "5"  # Polars 2.1 links jemalloc 5.3


def test_a_purge_hands_freed_pages_back() -> None:
    # In a fresh interpreter, so no other test's allocations blur RSS: 20M rows grouped
    # and dropped leave pages jemalloc keeps (its decay only runs as it allocates).
    script = textwrap.dedent("""
        import consumer
        import polars as pl
        from bench.research import jemalloc
        from bench.machine import rss_kb
        frame = pl.DataFrame({"k": pl.int_range(20_000_000, eager=True) % 1_000_000})
        grouped = frame.group_by("k").agg(pl.len())
        del frame, grouped
        before = rss_kb()[0]
        jemalloc.purge()
        print(before - rss_kb()[0])
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True, timeout=120)
    assert int(done.stdout.strip()) > 50 * 1024  # KiB: at least 50 MiB came back


def test_a_file_without_the_symbols_is_refused() -> None:
    with pytest.raises(LookupError, match="not a little-endian ELF64"):
        jemalloc.symbol_values(Path(__file__), ["_rjem_mallctl"])
    with pytest.raises(LookupError, match="no symbol table entry"):
        jemalloc.symbol_values(Path(sys.executable).resolve(), ["_rjem_no_such_symbol"])


def test_merges_into_big_enough_states_are_followed_by_a_purge() -> None:
    merge = PartialAggregator.merge
    run = purge.stream(1e8, 2_000, 1, min_rows=1_000)  # 25 polls of one message
    assert run["purges"] > 0
    assert run["purge_s"] > 0
    assert purge.stream(1e8, 2_000, 1, min_rows=10**9)["purges"] == 0
    assert PartialAggregator.merge is merge


def test_each_memory_point_runs_in_a_fresh_interpreter_purging_or_not() -> None:
    purged = purge.measure_memory(1e8, 2_000, 1, min_rows=0)
    kept = purge.measure_memory(1e8, 2_000, 1, min_rows=None)
    assert purged["groups"] == kept["groups"] == 2_000
    assert purged["purges"] > 0
    assert kept["purges"] == 0
    assert purged["steady_rss_mb"] > 0
