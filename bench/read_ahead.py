"""Polls read in a thread of their own, a few ahead of the thread that aggregates them.

The benchmarks' prefetching readers (bench.e2e's overlapped loop and Polars reader,
bench.polars_floor's read-ahead floor) share this: pyarrow's reads and Polars' queries
release the GIL, so reading the next poll can overlap grouping this one.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Generator, Iterable
from typing import TypeVar, cast

T = TypeVar("T")

_DONE = object()


def read_ahead(polls: Iterable[T], *, depth: int = 2,
               name: str = "bench-reader") -> Generator[T, None, None]:
    """Yield ``polls``, iterated in a thread at most ``depth`` polls ahead of the caller.

    An error in the reading thread is raised here, after the polls read before it. When
    the caller stops early, the thread stops after the poll it is reading and is joined
    when this generator is closed: close it (``contextlib.closing``) before closing a
    consumer the polls come from.
    """
    handed: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()
    failure: list[BaseException] = []

    def read() -> None:
        try:
            for poll in polls:
                if stop.is_set():
                    return
                handed.put(poll)
        except BaseException as err:  # noqa: BLE001 - handed to the caller, raised there
            failure.append(err)
        finally:
            handed.put(_DONE)

    reader = threading.Thread(target=read, name=name, daemon=True)
    reader.start()
    try:
        while (poll := handed.get()) is not _DONE:
            yield cast("T", poll)
        if failure:
            raise failure[0]
    finally:
        stop.set()
        while reader.is_alive():  # unblock a put into a full queue
            with contextlib.suppress(queue.Empty):
                handed.get(timeout=0.05)
        reader.join()
