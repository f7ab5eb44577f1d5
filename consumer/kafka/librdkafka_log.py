"""librdkafka's own log lines in the daemon's log: one ``librdkafka`` logger for every
client, so they come out in the daemon's format, with the retries librdkafka mends by
itself kept out of the warnings.

A coordinator still loading its state (the first minutes of a fresh broker), moving to
another broker, or a partition leader being elected: librdkafka logs each as a warning
and retries, and nothing is wrong unless the retries run out (which it reports as an
error). Such lines go out at INFO; kafka-python moved the same retriable coordinator
failures to debug (dpkp/kafka-python#1975).
"""

from __future__ import annotations

import logging

# Retriable conditions, as librdkafka names them in its log lines (lower case).
_EXPECTED = ("coordinator load in progress", "not coordinator", "coordinator not available",
             "leader not available", "not leader for partition",
             "not_leader_or_follower", "concurrent transactions")


class ExpectedRetries(logging.Filter):
    """Demotes a librdkafka warning about a retry it makes on its own to INFO."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING or not expected_retry(record.getMessage()):
            return True
        record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        # The logger let it through as a warning; as INFO it goes out only if INFO would.
        return logging.getLogger(record.name).isEnabledFor(logging.INFO)


def expected_retry(message: str) -> bool:
    text = message.lower()
    return "retr" in text and any(phrase in text for phrase in _EXPECTED)


def librdkafka_logger() -> logging.Logger:
    """The logger every client's ``logger`` setting names, with its filter (once)."""
    logger = logging.getLogger("librdkafka")
    if not any(isinstance(f, ExpectedRetries) for f in logger.filters):
        logger.addFilter(ExpectedRetries())
    return logger
