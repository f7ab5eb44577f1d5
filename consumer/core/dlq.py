"""Dead letters: the record a rejected message becomes, and the guard that stops the daemon
when bad input becomes the norm (after arroyo's DlqLimit)."""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Sequence

import pyarrow as pa

from consumer import __version__
from consumer.core.types import InputMessage, OutputRecord
from wire.errors import ArrowaggError, InputRejectedError
from wire.input import HEADER_CHUNK, encode_for_size

DLQ_HEADER_PREFIX = "arrowagg.dlq."
# What a record costs beyond its key, value and headers (record batch and record framing),
# with room to spare: the broker measures the whole batch against max.message.bytes.
_RECORD_OVERHEAD = 512


class DlqLimitExceededError(ArrowaggError):
    """Too much of the input is invalid: stopping beats dead-lettering a whole topic."""


def dead_letter(message: InputMessage, err: InputRejectedError, *, topic: str,
                group_id: str, max_bytes: int) -> OutputRecord:
    """The original key and value, with headers saying where it came from and why.

    A value too big for a record of ``max_bytes`` (the input topic may allow larger
    messages than the DLQ topic) is cut to fit, and headers say so: its original size
    and SHA-256. The whole message stays on the input topic at the offset the headers
    name, for as long as that topic's retention keeps it.
    """
    headers = _origin(message, err, group_id)
    value = message.value
    room = max_bytes - _RECORD_OVERHEAD - len(message.key or b"") - _size(headers)
    if value is not None and len(value) > room:
        headers += [(DLQ_HEADER_PREFIX + "truncated", b"true"),
                    (DLQ_HEADER_PREFIX + "original-size", str(len(value)).encode()),
                    (DLQ_HEADER_PREFIX + "original-sha256",
                     hashlib.sha256(value).hexdigest().encode())]
        value = value[:max(0, room - _size(headers[-3:]))]
    return OutputRecord(topic, message.key, value, headers)


def dead_rows(message: InputMessage, rows: pa.Table, err: InputRejectedError, *, topic: str,
              group_id: str, max_bytes: int) -> list[OutputRecord]:
    """Rows taken out of an otherwise valid message (``err`` says why), as Arrow IPC
    streams of those rows only, split by rows to fit ``max_bytes``."""
    headers = [*_origin(message, err, group_id),
               (DLQ_HEADER_PREFIX + "rows", str(rows.num_rows).encode())]
    room = max_bytes - _RECORD_OVERHEAD - _size(headers) - 32  # + the chunk header
    pieces = encode_for_size(rows, max_bytes=max(room, 1), compression="zstd")
    return [OutputRecord(topic, message.key, piece,
                         [*headers, (HEADER_CHUNK, f"{i}/{len(pieces)}".encode())])
            for i, piece in enumerate(pieces, start=1)]


def _origin(message: InputMessage, err: InputRejectedError,
            group_id: str) -> list[tuple[str, str | bytes | None]]:
    fields = {
        "original-topic": message.partition[0],
        "original-partition": str(message.partition[1]),
        "original-offset": str(message.offset),
        "original-timestamp": str(message.timestamp_ms),
        "consumer-group": group_id,
        "error-class": err.reason,
        "error-message": err.detail[:1000],
        "daemon-version": __version__,
    }
    return [(DLQ_HEADER_PREFIX + k, v.encode()) for k, v in fields.items()]


def _size(headers: Sequence[tuple[str, str | bytes | None]]) -> int:
    return sum(len(name) + len(value or b"") for name, value in headers)


class DlqLimit:
    def __init__(self, *, max_invalid_ratio: float, window_messages: int,
                 max_consecutive_invalid: int) -> None:
        """Stop when more than ``max_invalid_ratio`` of the last ``window_messages``
        messages, or more than ``max_consecutive_invalid`` in a row, were invalid."""
        self._max_ratio = max_invalid_ratio
        self._max_consecutive = max_consecutive_invalid
        self._recent: deque[bool] = deque(maxlen=window_messages)
        self._invalid_in_window = 0
        self._consecutive = 0

    def record(self, *, valid: bool) -> None:
        """Count one message; raise DlqLimitExceededError when a limit is passed."""
        if len(self._recent) == self._recent.maxlen and not self._recent[0]:
            self._invalid_in_window -= 1
        self._recent.append(valid)
        if valid:
            self._consecutive = 0
            return
        self._invalid_in_window += 1
        self._consecutive += 1
        if self._consecutive > self._max_consecutive:
            raise DlqLimitExceededError(
                f"{self._consecutive} invalid messages in a row (dlq_limit."
                f"max_consecutive_invalid = {self._max_consecutive}); check the "
                "producers, or raise the limit")
        full = len(self._recent) == self._recent.maxlen
        ratio = self._invalid_in_window / len(self._recent)
        if full and ratio > self._max_ratio:
            raise DlqLimitExceededError(
                f"{ratio:.0%} of the last {len(self._recent)} messages were invalid "
                f"(dlq_limit.max_invalid_ratio = {self._max_ratio}); check the "
                "producers, or raise the limit")
