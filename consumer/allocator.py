"""Polars' allocator, configured before Polars loads: one jemalloc arena a core.

Polars allocates through its own jemalloc, which by default keeps four arenas a core and
hands each thread one of them; what a thread frees stays in its arena for the next
allocation made there. The merges run on Polars' whole thread pool, so every arena keeps
its own high-water mark of transient buffers. One arena a core measured (bench.memory,
4 GB streamed, three interleaved runs each on one machine; docs/benchmark-findings.md)
427-472 bytes an open group at a million groups against 483-519 with the defaults,
the kernel within ~3% either way and no measurable end-to-end cost.

jemalloc reads ``_RJEM_MALLOC_CONF`` once, when Polars' library loads, so this has to run
before the first ``import polars``: ``consumer/__init__.py`` calls it. Polars' own
``__init__`` adds its decay settings to the same variable the same way.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Container, MutableMapping

ALLOCATOR_ENV = "_RJEM_MALLOC_CONF"


def usable_cores() -> int:
    """The cores this process may run on (its affinity: systemd CPUAffinity=, taskset)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def with_one_arena_per_core(operator_conf: str | None, cores: int) -> str:
    """Our ``narenas`` first: jemalloc lets a later option win, so an operator's own
    ``_RJEM_MALLOC_CONF`` (``narenas`` included) still decides."""
    ours = f"narenas:{cores}"
    return f"{ours},{operator_conf}" if operator_conf else ours


def configure_polars_allocator(environ: MutableMapping[str, str] = os.environ,
                               loaded: Container[str] = sys.modules) -> bool:
    """Set one arena a core for Polars' jemalloc; False (and nothing set) when Polars is
    already loaded, since its allocator has read its options by then."""
    if "polars" in loaded:
        return False
    environ[ALLOCATOR_ENV] = with_one_arena_per_core(environ.get(ALLOCATOR_ENV),
                                                     usable_cores())
    return True
