"""One jemalloc arena a core for Polars, read back from jemalloc itself.

jemalloc's ``stats_print`` option prints the options it runs with when the process exits,
so each case starts a fresh interpreter (the allocator reads its options once, at load)
and checks what Polars' jemalloc actually took, not what the environment says.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from consumer.allocator import configure_polars_allocator, with_one_arena_per_core


def jemalloc_arenas(script: str, operator_conf: str = "") -> int:
    """``opt.narenas`` as Polars' jemalloc reports it at exit, after running ``script``."""
    conf = f"{operator_conf},stats_print:true" if operator_conf else "stats_print:true"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True, timeout=120, env={"_RJEM_MALLOC_CONF": conf,
                                                        "PATH": "/usr/bin:/bin"})
    found = re.search(r"opt\.narenas: (\d+)", done.stderr)
    assert found, done.stderr[-2000:]
    return int(found.group(1))


def pinned(cores: set[int], then: str) -> str:
    return f"import os; os.sched_setaffinity(0, {cores}); {then}"


ALL_CORES = os.sched_getaffinity(0)


@pytest.mark.parametrize("cores", [{min(ALL_CORES)}, ALL_CORES], ids=["one core", "all"])
def test_importing_the_daemon_gives_polars_one_arena_per_usable_core(cores: set[int]) -> None:
    assert jemalloc_arenas(pinned(cores, "import consumer, polars")) == len(cores)


def test_an_operators_narenas_wins_over_the_daemons() -> None:
    assert jemalloc_arenas("import consumer, polars", operator_conf="narenas:5") == 5


def test_nothing_changes_when_polars_loaded_first() -> None:
    """Too late to count: the default (four a core) stays, whatever the daemon sets."""
    default = jemalloc_arenas("import polars")
    assert default > len(ALL_CORES)
    assert jemalloc_arenas("import polars, consumer") == default


def test_the_daemons_option_goes_first_and_keeps_the_operators() -> None:
    assert with_one_arena_per_core(None, 2) == "narenas:2"
    assert with_one_arena_per_core("", 3) == "narenas:3"
    assert with_one_arena_per_core("dirty_decay_ms:200", 2) == "narenas:2,dirty_decay_ms:200"


def test_configure_leaves_the_environment_alone_once_polars_is_loaded() -> None:
    environ = {"_RJEM_MALLOC_CONF": "muzzy_decay_ms:0"}
    assert configure_polars_allocator(environ, loaded={"polars"}) is False
    assert environ == {"_RJEM_MALLOC_CONF": "muzzy_decay_ms:0"}
    assert configure_polars_allocator(environ, loaded=set()) is True
    assert re.fullmatch(r"narenas:\d+,muzzy_decay_ms:0", environ["_RJEM_MALLOC_CONF"])
