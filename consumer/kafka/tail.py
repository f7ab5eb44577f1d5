"""Read the output topic: each window as a Polars DataFrame (``read_output``), or live
on a terminal (``tail``) — the seed's print_batches, done right."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import TextIO

import polars as pl
from confluent_kafka import Consumer, Message

from wire.output import OutputWindow, decode_output


def read_output(bootstrap_servers: str, topic: str, *, from_beginning: bool = True,
                idle_timeout_s: float = 5.0, max_windows: int | None = None,
                ) -> Iterator[OutputWindow]:
    """Yield output messages as ``OutputWindow``s (read_committed) until the topic has been
    quiet for ``idle_timeout_s`` or ``max_windows`` messages were read."""
    for message in _read(bootstrap_servers, [topic], from_beginning=from_beginning,
                         idle_timeout_s=idle_timeout_s, limit=max_windows):
        yield decode_output(message.value(), message.headers())


def _read(bootstrap_servers: str, topics: list[str], *, from_beginning: bool = True,
          idle_timeout_s: float, limit: int | None) -> Iterator[Message]:
    consumer = Consumer({
        "bootstrap.servers": bootstrap_servers,
        "group.id": f"arrowagg-tail-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest" if from_beginning else "latest",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
    })
    assigned: list[bool] = []
    consumer.subscribe(topics, on_assign=lambda *_: assigned.append(True))
    seen = 0
    quiet_since = time.monotonic()
    try:
        while limit is None or seen < limit:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                if not assigned:  # the quiet time counts from joining the group
                    quiet_since = time.monotonic()
                elif time.monotonic() - quiet_since > idle_timeout_s:
                    return
                continue
            quiet_since = time.monotonic()
            seen += 1
            yield message
    finally:
        consumer.close()


def peek_first_value(bootstrap_servers: str, topics: list[str], *,
                     timeout_s: float = 10.0) -> bytes | None:
    """The value of the first message found on ``topics``, without committing anything."""
    for message in _read(bootstrap_servers, topics, idle_timeout_s=timeout_s, limit=1):
        return message.value()
    return None


def read_windows(bootstrap_servers: str, topic: str, *, idle_timeout_s: float = 5.0,
                 ) -> pl.DataFrame:
    """Every row of every output window on ``topic``, as one DataFrame."""
    windows = read_output(bootstrap_servers, topic, idle_timeout_s=idle_timeout_s)
    frames = [w.frame for w in windows]
    return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()


def print_window(window: OutputWindow, out: TextIO, *, max_rows: int = 20) -> None:
    chunk = "" if window.chunk == (1, 1) else f" chunk {window.chunk[0]}/{window.chunk[1]}"
    start = _iso(window.start_ms)
    end = _iso(window.end_ms)
    out.write(f"window [{start}, {end}){chunk}: {window.frame.height} groups, "
              f"{window.window_rows} input rows, {'final' if window.final else 'partial'}\n")
    frame = window.frame
    bounds = [c for c in ("window_start", "window_end") if c in frame.columns]
    if all(frame.get_column(c).n_unique() <= 1 for c in bounds):  # else: sessions, per row
        frame = frame.drop(bounds)
    with pl.Config(tbl_rows=max_rows, tbl_cols=-1, tbl_width_chars=160,
                   tbl_hide_dataframe_shape=True):
        out.write(f"{frame}\n")
    out.flush()


def _iso(epoch_ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch_ms / 1000)) + (
        f".{epoch_ms % 1000:03d}Z")
