"""Logging for the daemon: plain text for people, JSON lines for log pipelines; either
way each line's time is RFC 3339 in UTC with milliseconds (wire/timestamps.py), the one
form of every time arrowagg writes as text."""

from __future__ import annotations

import json
import logging
import sys
from typing import Literal

from wire.timestamps import rfc3339_ms


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: ARG002, N802 - logging's name
        return rfc3339_ms(int(record.created * 1000))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": rfc3339_ms(int(record.created * 1000)),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str, fmt: Literal["text", "json"]) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
