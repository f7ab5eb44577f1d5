"""Read the daemon's topics: output windows (``read_output``) and dead letters
(``read_dead_letters``), for Python callers and for ``python -m consumer tail``.

The reader joins no consumer group: it is assigned every partition of the topic, from
its beginning or its end, so it commits nothing and starts at once. It reads with
``isolation.level=read_committed``, as subscribers of an exactly-once output must. Every
failure is one line: no broker within the connect timeout, a missing topic, a topic
that does not hold what was asked for, a broker lost while waiting.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any, TextIO

import polars as pl
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, TopicPartition

from consumer.config import KafkaSettings
from consumer.core.dlq import DLQ_HEADER_PREFIX
from consumer.kafka.clients import KafkaSetupError, cluster_metadata, quiet_config
from wire.complete import WindowAssembler
from wire.errors import UsageError
from wire.input import HEADER_SCHEMA_FINGERPRINT
from wire.output import OutputFormatError, OutputWindow, decode_message
from wire.timestamps import rfc3339_columns, rfc3339_datetime, rfc3339_ms

# A bootstrap address, or the daemon's Kafka settings (security included).
Source = str | KafkaSettings
# Told about each message skipped as not what was asked for (a line for a human).
Skipped = Callable[[str], None]

CONNECT_TIMEOUT_S = 10.0


class NotOutputError(UsageError):
    """The topic holds something else than what was asked for (windows, dead letters)."""


@dataclass(frozen=True)
class Record:
    """One message as read, with where it is."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]

    @property
    def where(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"

    def header(self, name: str) -> str | None:
        found = [v for k, v in self.headers if k == name]
        return found[-1].decode(errors="replace") if found else None


@dataclass(frozen=True)
class DeadLetter:
    """A rejected input message, as the daemon dead-lettered it (consumer/core/dlq.py)."""

    record: Record  # the dead letter itself, on the dead-letter topic
    origin: str     # where the input message was: topic[partition]@offset
    origin_timestamp_ms: int | None
    reason: str
    message: str
    consumer_group: str
    daemon_version: str

    def as_json(self) -> dict[str, Any]:
        return {"origin": self.origin, "origin_timestamp": _iso(self.origin_timestamp_ms),
                "reason": self.reason, "message": self.message,
                "consumer_group": self.consumer_group, "daemon_version": self.daemon_version,
                "value_bytes": len(self.record.value or b""), "key": _text(self.record.key),
                "dead_letter": self.record.where}


def read_records(source: Source, topics: list[str], *, from_beginning: bool = True,
                 idle_timeout_s: float = 5.0, limit: int | None = None,
                 connect_timeout_s: float | None = None) -> Iterator[Record]:
    """Every message of ``topics`` until none arrived for ``idle_timeout_s`` (``inf``:
    never stop) or ``limit`` were read; KafkaSetupError when no broker answers within
    ``connect_timeout_s``, a topic is missing, or the broker is lost while waiting."""
    kafka = source if isinstance(source, KafkaSettings) else KafkaSettings(
        bootstrap_servers=source)
    errors: list[KafkaError] = []
    consumer = Consumer({**quiet_config(kafka, errors), "group.id": "arrowagg-reader",
                         "enable.auto.commit": False, "enable.partition.eof": False,
                         "isolation.level": "read_committed"})
    try:
        metadata = cluster_metadata(consumer, kafka, errors,
                                    connect_timeout_s or CONNECT_TIMEOUT_S)
        if missing := [t for t in topics if t not in metadata.topics]:
            raise KafkaSetupError(f"topic {', '.join(missing)} does not exist on "
                                  f"{kafka.bootstrap_servers}; check the topic name")
        start = OFFSET_BEGINNING if from_beginning else OFFSET_END
        consumer.assign([TopicPartition(t, p, start)
                         for t in topics for p in sorted(metadata.topics[t].partitions)])
        yield from _poll(consumer, kafka, errors, idle_timeout_s, limit)
    finally:
        consumer.close()


def _poll(consumer: Consumer, kafka: KafkaSettings, errors: list[KafkaError],
          idle_timeout_s: float, limit: int | None) -> Iterator[Record]:
    seen = 0
    quiet_since = time.monotonic()
    while limit is None or seen < limit:
        message = consumer.poll(0.5)
        if message is None or message.error() is not None:
            if time.monotonic() - quiet_since < idle_timeout_s:
                continue
            if down := [e for e in errors if e.code() == KafkaError._ALL_BROKERS_DOWN]:
                raise KafkaSetupError(f"nothing arrived for {idle_timeout_s:g}s and Kafka at "
                                      f"{kafka.bootstrap_servers} is lost ({down[-1].str()})")
            return
        errors.clear()  # what went wrong before this message has mended itself
        quiet_since = time.monotonic()
        seen += 1
        raw = message.headers() or []
        headers = [(k, v) for k, v in (raw.items() if isinstance(raw, dict) else raw)
                   if isinstance(v, bytes)]
        yield Record(message.topic() or "", message.partition() or 0, message.offset() or 0,
                     message.timestamp()[1], message.key(), message.value(), headers)


def read_output(bootstrap_servers: Source, topic: str, *, from_beginning: bool = True,
                idle_timeout_s: float = 5.0, max_windows: int | None = None,
                on_skipped: Skipped | None = None,
                complete: bool = False) -> Iterator[OutputWindow]:
    """Yield output messages as ``OutputWindow``s (read_committed) until the topic has been
    quiet for ``idle_timeout_s`` or ``max_windows`` messages were read.

    A message that is not arrowagg output raises NotOutputError naming it; with
    ``on_skipped``, one after the first window is skipped and reported there instead.
    ``complete``: yield each window once, whole, when all its messages are in (its
    chunks, revisions and, with the scale-out, every part: wire/complete.py); otherwise
    the scale-out's end-of-window markers are not yielded."""
    seen_one = False
    assembler = WindowAssembler()
    for record in read_records(bootstrap_servers, [topic], from_beginning=from_beginning,
                               idle_timeout_s=idle_timeout_s, limit=max_windows):
        try:
            decoded = decode_message(record.value, record.headers)
        except OutputFormatError as err:
            problem = f"{record.where} is not arrowagg output ({err}){_hint(record)}"
            if on_skipped is None or not seen_one:
                raise NotOutputError(problem) from None
            on_skipped(f"skipped {problem}")
            continue
        seen_one = True
        if complete:
            if (whole := assembler.add(decoded)) is not None:
                yield whole
        elif isinstance(decoded, OutputWindow):
            yield decoded


def read_dead_letters(source: Source, topic: str, *, from_beginning: bool = True,
                      idle_timeout_s: float = 5.0, limit: int | None = None,
                      on_skipped: Skipped | None = None) -> Iterator[DeadLetter]:
    """The dead letters on ``topic``, as ``read_output`` reads windows."""
    seen_one = False
    for record in read_records(source, [topic], from_beginning=from_beginning,
                               idle_timeout_s=idle_timeout_s, limit=limit):
        letter = _dead_letter(record)
        if letter is None:
            problem = (f"{record.where} is not a dead letter (no {DLQ_HEADER_PREFIX}error-class "
                       f"header){_hint(record)}")
            if on_skipped is None or not seen_one:
                raise NotOutputError(problem)
            on_skipped(f"skipped {problem}")
            continue
        seen_one = True
        yield letter


def _dead_letter(record: Record) -> DeadLetter | None:
    def field(name: str) -> str:
        return record.header(DLQ_HEADER_PREFIX + name) or ""

    if record.header(DLQ_HEADER_PREFIX + "error-class") is None:
        return None
    origin = (f"{field('original-topic')}[{field('original-partition')}]"
              f"@{field('original-offset')}")
    stamp = field("original-timestamp")
    return DeadLetter(record, origin, int(stamp) if stamp.lstrip("-").isdigit() else None,
                      field("error-class"), field("error-message"), field("consumer-group"),
                      field("daemon-version"))


def _hint(record: Record) -> str:
    if record.header(HEADER_SCHEMA_FINGERPRINT) is not None:
        return "; it is arrowagg input: tail the output topic (output.topic)"
    if record.header(DLQ_HEADER_PREFIX + "error-class") is not None:
        return "; it is a dead letter: use tail --dlq"
    return ""


def peek_first_record(source: Source, topics: list[str], *,
                      timeout_s: float = 10.0) -> Record | None:
    """The first message found on ``topics``, without committing anything."""
    for record in read_records(source, topics, idle_timeout_s=timeout_s, limit=1,
                               connect_timeout_s=timeout_s):
        return record
    return None


def read_windows(bootstrap_servers: Source, topic: str, *, idle_timeout_s: float = 5.0,
                 ) -> pl.DataFrame:
    """Every row of every output window on ``topic``, as one DataFrame."""
    windows = read_output(bootstrap_servers, topic, idle_timeout_s=idle_timeout_s)
    frames = [w.frame for w in windows]
    return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()


# -- on a terminal -----------------------------------------------------------------------


_KIND_WORDS = {"full": "the whole window", "delta": "rows since the last revision, to add",
               "update": "changed groups, replacing theirs"}


def print_window(window: OutputWindow, out: TextIO, *, max_rows: int = 20) -> None:
    chunk = "" if window.chunk == (1, 1) else f" chunk {window.chunk[0]}/{window.chunk[1]}"
    start = _iso(window.start_ms)
    end = _iso(window.end_ms)
    revision = "" if window.revision == 0 and window.kind == "full" else (
        f", revision {window.revision} ({_KIND_WORDS[window.kind]})")
    out.write(f"window [{start}, {end}){chunk}: {window.frame.height} groups, "
              f"{window.window_rows} input rows, {'final' if window.final else 'partial'}"
              f"{revision}\n")
    frame = window.frame
    bounds = [c for c in ("window_start", "window_end") if c in frame.columns]
    if all(frame.get_column(c).n_unique() <= 1 for c in bounds):  # else: sessions, per row
        frame = frame.drop(bounds)
    with pl.Config(tbl_rows=max_rows, tbl_cols=-1, tbl_width_chars=160,
                   tbl_hide_dataframe_shape=True):
        out.write(f"{frame}\n")
    out.flush()


def window_json(window: OutputWindow) -> str:
    """One line of JSON for a window (for jq): its bounds, flags and every result row."""
    document = {"window_start": _iso(window.start_ms), "window_end": _iso(window.end_ms),
                "final": window.final, "revision": window.revision, "kind": window.kind,
                "input_rows": window.window_rows, "chunk": list(window.chunk),
                "rows": [{k: _finite(v) for k, v in row.items()}
                         for row in rfc3339_columns(window.frame).to_dicts()]}
    return json.dumps(document, default=_jsonable, ensure_ascii=False)


def print_dead_letter(letter: DeadLetter, out: TextIO) -> None:
    out.write(f"{letter.origin} ({_iso(letter.origin_timestamp_ms)}): {letter.reason}: "
              f"{letter.message} [{len(letter.record.value or b'')} bytes, group "
              f"{letter.consumer_group}, dead letter {letter.record.where}]\n")
    out.flush()


def dead_letter_json(letter: DeadLetter) -> str:
    return json.dumps(letter.as_json(), ensure_ascii=False)


def _jsonable(value: object) -> object:
    if isinstance(value, datetime):
        return rfc3339_datetime(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def _finite(value: object) -> object:
    """NaN and infinities are not JSON: null, as a missing aggregate would be."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode(errors="replace")


def _iso(epoch_ms: int | None) -> str | None:
    return None if epoch_ms is None else rfc3339_ms(epoch_ms)
