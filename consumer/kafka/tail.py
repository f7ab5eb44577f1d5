"""Read the daemon's topics: output windows (``read_output``), dead letters
(``read_dead_letters``) and late records (``read_late_records``), for Python callers and
for ``python -m consumer tail`` (consumer/kafka/tail_views.py shows them).

The reader joins no consumer group: it is assigned every partition of the topic, from
its beginning or its end, so it commits nothing and starts at once. It reads with
``isolation.level=read_committed``, as subscribers of an exactly-once output must. Every
failure is one line: no broker within the connect timeout, a missing topic, a topic
that does not hold what was asked for, a broker lost while waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import polars as pl
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, TopicPartition

from consumer.config import KafkaSettings
from consumer.core.dlq import DLQ_HEADER_PREFIX
from consumer.core.late import LATE_HEADER_PREFIX
from consumer.kafka.clients import KafkaSetupError, cluster_metadata, quiet_config
from wire.complete import WindowAssembler
from wire.errors import UsageError
from wire.input import HEADER_CHUNK, HEADER_SCHEMA_FINGERPRINT, WireFormatError, decode_ipc_stream
from wire.output import (
    HEADER_WINDOW_END,
    HEADER_WINDOW_START,
    FrontierMarker,
    OutputFormatError,
    OutputWindow,
    WindowEnd,
    decode_message,
)
from wire.timestamps import rfc3339_ms

# A bootstrap address, or the daemon's Kafka settings (security included).
Source = str | KafkaSettings
# Told about each message skipped as not what was asked for (a line for a human).
Skipped = Callable[[str], None]
Decoded = TypeVar("Decoded")

CONNECT_TIMEOUT_S = 10.0


class NotOutputError(UsageError):
    """The topic holds something else than what was asked for (windows, dead letters,
    late records)."""


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
        stamp = self.origin_timestamp_ms
        return {"origin": self.origin,
                "origin_timestamp": None if stamp is None else rfc3339_ms(stamp),
                "reason": self.reason, "message": self.message,
                "consumer_group": self.consumer_group, "daemon_version": self.daemon_version,
                "value_bytes": len(self.record.value or b""), "key": _text(self.record.key),
                "dead_letter": self.record.where}


@dataclass(frozen=True)
class LateRecord:
    """Rows that came after their window was emitted (consumer/core/late.py): ``rows``,
    input rows of the message ``origin`` with the window they missed; or ``aggregate``,
    the scale-out's finalized results of partial states that came too late."""

    record: Record  # the late record itself, on the late topic
    kind: Literal["rows", "aggregate"]
    origin: str | None  # where the input message was (rows only): topic[partition]@offset
    start_ms: int
    end_ms: int
    chunk: tuple[int, int]
    frame: pl.DataFrame  # window_start and window_end as timestamps, like the output's


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
    assembler = WindowAssembler()
    records = read_records(bootstrap_servers, [topic], from_beginning=from_beginning,
                           idle_timeout_s=idle_timeout_s, limit=max_windows)
    for decoded in _read_as(records, _output_message, on_skipped):
        if complete:
            if (whole := assembler.add(decoded)) is not None:
                yield whole
        elif isinstance(decoded, OutputWindow):
            yield decoded


def read_dead_letters(source: Source, topic: str, *, from_beginning: bool = True,
                      idle_timeout_s: float = 5.0, limit: int | None = None,
                      on_skipped: Skipped | None = None) -> Iterator[DeadLetter]:
    """The dead letters on ``topic``, as ``read_output`` reads windows."""
    records = read_records(source, [topic], from_beginning=from_beginning,
                           idle_timeout_s=idle_timeout_s, limit=limit)
    yield from _read_as(records, _dead_letter, on_skipped)


def read_late_records(source: Source, topic: str, *, from_beginning: bool = True,
                      idle_timeout_s: float = 5.0, limit: int | None = None,
                      on_skipped: Skipped | None = None) -> Iterator[LateRecord]:
    """The late records on ``topic`` (``output.late_topic``), as ``read_output`` reads
    windows."""
    records = read_records(source, [topic], from_beginning=from_beginning,
                           idle_timeout_s=idle_timeout_s, limit=limit)
    yield from _read_as(records, _late_record, on_skipped)


class _NotThisError(Exception):
    """A record that is not what the reader reads; ``str()``: what it is not, and why."""


def _read_as(records: Iterator[Record], decode: Callable[[Record], Decoded],
             on_skipped: Skipped | None) -> Iterator[Decoded]:
    """Each record decoded; one that is not what was asked for raises NotOutputError,
    or, after the first good one and with ``on_skipped``, is reported there."""
    seen_one = False
    for record in records:
        try:
            decoded = decode(record)
        except _NotThisError as err:
            problem = f"{record.where} is not {err}{_hint(record)}"
            if on_skipped is None or not seen_one:
                raise NotOutputError(problem) from None
            on_skipped(f"skipped {problem}")
            continue
        seen_one = True
        yield decoded


def _output_message(record: Record) -> OutputWindow | WindowEnd | FrontierMarker:
    if _is_late(record) or record.header(DLQ_HEADER_PREFIX + "error-class") is not None:
        raise _NotThisError("arrowagg output")
    try:
        return decode_message(record.value, record.headers)
    except OutputFormatError as err:
        raise _NotThisError(f"arrowagg output ({err})") from None


def _dead_letter(record: Record) -> DeadLetter:
    def field(name: str) -> str:
        return record.header(DLQ_HEADER_PREFIX + name) or ""

    if record.header(DLQ_HEADER_PREFIX + "error-class") is None:
        raise _NotThisError(f"a dead letter (no {DLQ_HEADER_PREFIX}error-class header)")
    origin = (f"{field('original-topic')}[{field('original-partition')}]"
              f"@{field('original-offset')}")
    stamp = field("original-timestamp")
    return DeadLetter(record, origin, int(stamp) if stamp.lstrip("-").isdigit() else None,
                      field("error-class"), field("error-message"), field("consumer-group"),
                      field("daemon-version"))


def _late_record(record: Record) -> LateRecord:
    if not _is_late(record):
        raise _NotThisError(f"a late record (no {LATE_HEADER_PREFIX}* header)")
    late = LATE_HEADER_PREFIX
    topic = record.header(late + "original-topic")
    origin = None if topic is None else (f"{topic}[{record.header(late + 'original-partition')}]"
                                         f"@{record.header(late + 'original-offset')}")
    try:
        start = int(record.header(HEADER_WINDOW_START) or "")
        end = int(record.header(HEADER_WINDOW_END) or "")
        index, _, count = (record.header(HEADER_CHUNK) or "1/1").partition("/")
        frame = pl.DataFrame(decode_ipc_stream(record.value))
    except (ValueError, WireFormatError) as err:
        raise _NotThisError(f"a readable late record ({err})") from None
    bounds = [pl.col(c).cast(pl.Datetime("ms", "UTC")) for c in ("window_start", "window_end")
              if c in frame.columns and frame.schema[c].is_integer()]
    kind: Literal["rows", "aggregate"] = (
        "aggregate" if record.header(late + "kind") == "aggregate" else "rows")
    return LateRecord(record, kind, origin, start, end, (int(index), int(count)),
                      frame.with_columns(bounds) if bounds else frame)


def _is_late(record: Record) -> bool:
    return any(name.startswith(LATE_HEADER_PREFIX) for name, _ in record.headers)


def _hint(record: Record) -> str:
    if record.header(HEADER_SCHEMA_FINGERPRINT) is not None:
        return "; it is arrowagg input: tail the output topic (output.topic)"
    if record.header(DLQ_HEADER_PREFIX + "error-class") is not None:
        return "; it is a dead letter: use tail --dlq"
    if _is_late(record):
        return "; it is a late record: use tail --late"
    if record.header(HEADER_WINDOW_START) is not None:
        return "; it is an output window: use tail --topic"
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


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode(errors="replace")
