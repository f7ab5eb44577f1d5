"""Dead letters: the record a rejected message becomes, and the guard that stops the daemon
when bad input becomes the norm (after arroyo's DlqLimit)."""

from __future__ import annotations

from collections import deque

from confluent_kafka import Message

from consumer import __version__
from consumer.config import DlqLimitSettings
from consumer.core.decode import RejectedMessageError
from consumer.core.types import OutputRecord

HEADER_PREFIX = "arrowagg.dlq."


class DlqLimitExceededError(Exception):
    """Too much of the input is invalid: stopping beats dead-lettering a whole topic."""


def dead_letter(message: Message, err: RejectedMessageError, *, topic: str,
                group_id: str) -> OutputRecord:
    """The original key and value, with headers saying where it came from and why."""
    _kind, timestamp = message.timestamp()
    fields = {
        "original-topic": message.topic() or "",
        "original-partition": str(message.partition()),
        "original-offset": str(message.offset()),
        "original-timestamp": str(timestamp),
        "consumer-group": group_id,
        "error-class": err.reason,
        "error-message": err.detail[:1000],
        "daemon-version": __version__,
    }
    headers = [(HEADER_PREFIX + k, v.encode()) for k, v in fields.items()]
    return OutputRecord(topic, message.key(), message.value(), headers)


class DlqLimit:
    def __init__(self, settings: DlqLimitSettings) -> None:
        self._settings = settings
        self._recent: deque[bool] = deque(maxlen=settings.window_messages)
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
        limits = self._settings
        if self._consecutive > limits.max_consecutive_invalid:
            raise DlqLimitExceededError(
                f"{self._consecutive} invalid messages in a row (dlq_limit."
                f"max_consecutive_invalid = {limits.max_consecutive_invalid}); check the "
                "producers, or raise the limit")
        full = len(self._recent) == self._recent.maxlen
        ratio = self._invalid_in_window / len(self._recent)
        if full and ratio > limits.max_invalid_ratio:
            raise DlqLimitExceededError(
                f"{ratio:.0%} of the last {len(self._recent)} messages were invalid "
                f"(dlq_limit.max_invalid_ratio = {limits.max_invalid_ratio}); check the "
                "producers, or raise the limit")
