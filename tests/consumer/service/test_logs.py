"""The daemon's log lines carry RFC 3339 UTC times, in text and in JSON."""

from __future__ import annotations

import json
import logging

from consumer.service.logs import JsonFormatter, TextFormatter
from tests.wire.helpers import RFC3339_UTC


def record() -> logging.LogRecord:
    entry = logging.LogRecord("consumer", logging.INFO, __file__, 1, "hello %s", ("there",),
                              None)
    entry.created = 1_704_067_200.125  # 2024-01-01T00:00:00.125Z
    return entry


def test_text_lines_start_with_an_rfc3339_time() -> None:
    line = TextFormatter().format(record())
    assert line == "2024-01-01T00:00:00.125Z INFO consumer: hello there"


def test_json_lines_carry_an_rfc3339_time() -> None:
    entry = json.loads(JsonFormatter().format(record()))
    assert entry["ts"] == "2024-01-01T00:00:00.125Z"
    assert RFC3339_UTC.match(entry["ts"])
    assert entry["message"] == "hello there"
