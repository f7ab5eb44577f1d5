"""librdkafka's warnings about retries it makes on its own come out at INFO; its other
warnings stay warnings."""

from __future__ import annotations

import logging

import pytest

from consumer.kafka.librdkafka_log import librdkafka_logger


@pytest.mark.parametrize(("message", "level"), [
    ("COMMITFAIL [thrd:main]: Coordinator load in progress: retrying", logging.INFO),
    ("TXNERR [thrd:main]: Broker: Not coordinator: retrying", logging.INFO),
    ("FAIL [thrd:127.0.0.1:9092/1]: Connect to ipv4#127.0.0.1:9092 failed", logging.WARNING),
    ("CONFWARN [thrd:app]: Configuration property x is a producer property", logging.WARNING),
])
def test_expected_retries_are_not_warnings(message: str, level: int,
                                           caplog: pytest.LogCaptureFixture) -> None:
    logger = librdkafka_logger()
    with caplog.at_level(logging.INFO, "librdkafka"):
        logger.warning("%s", message)
    [record] = caplog.records
    assert (record.levelno, record.getMessage()) == (level, message)


def test_a_demoted_line_is_dropped_where_only_warnings_are_wanted(
        caplog: pytest.LogCaptureFixture) -> None:
    logger = librdkafka_logger()
    with caplog.at_level(logging.WARNING, "librdkafka"):
        logger.warning("COMMITFAIL [thrd:main]: Coordinator load in progress: retrying")
        logger.warning("FAIL [thrd:main]: Connect failed")
    assert [r.getMessage() for r in caplog.records] == ["FAIL [thrd:main]: Connect failed"]
    assert len(librdkafka_logger().filters) == 1, "the filter is added once"
