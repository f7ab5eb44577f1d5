"""Dead letters: the record a rejected message becomes, and the guard that stops the daemon
when bad input becomes the norm (after arroyo's DlqLimit)."""

from __future__ import annotations

from collections import deque

from consumer import __version__
from consumer.core.types import InputMessage, OutputRecord
from wire.errors import ArrowaggError, InputRejectedError

HEADER_PREFIX = "arrowagg.dlq."


class DlqLimitExceededError(ArrowaggError):
    """Too much of the input is invalid: stopping beats dead-lettering a whole topic."""


def dead_letter(message: InputMessage, err: InputRejectedError, *, topic: str,
                group_id: str) -> OutputRecord:
    """The original key and value, with headers saying where it came from and why."""
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
    headers = [(HEADER_PREFIX + k, v.encode()) for k, v in fields.items()]
    return OutputRecord(topic, message.key, message.value, headers)


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
