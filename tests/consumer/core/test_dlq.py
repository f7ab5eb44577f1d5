"""The DLQ guard stops the daemon when bad input becomes the norm, not before."""

from __future__ import annotations

import pytest

from consumer.core.dlq import DlqLimit, DlqLimitExceededError


def feed(guard: DlqLimit, pattern: str) -> None:
    for mark in pattern:
        guard.record(valid=mark == ".")


def test_consecutive_invalid_over_the_limit_stops() -> None:
    guard = DlqLimit(max_consecutive_invalid=3, max_invalid_ratio=1.0, window_messages=10)
    feed(guard, "xxx.xxx.")  # three in a row, twice: still within the limit
    with pytest.raises(DlqLimitExceededError, match="4 invalid messages in a row"):
        feed(guard, "xxxx")


def test_ratio_is_judged_over_a_full_window_only() -> None:
    guard = DlqLimit(max_consecutive_invalid=100, max_invalid_ratio=0.5, window_messages=10)
    feed(guard, "xxxxx")  # 100% invalid, but only 5 messages seen: not yet judged
    feed(guard, ".....")  # 50% of a full window: at the limit, not over it
    feed(guard, "xxxxx")  # the window slides: each new bad one replaces an old one
    with pytest.raises(DlqLimitExceededError, match="60% of the last 10 messages"):
        feed(guard, "x")  # now a good one leaves the window: 6 of the last 10 are bad


def test_good_input_keeps_the_window_clean() -> None:
    guard = DlqLimit(max_consecutive_invalid=2, max_invalid_ratio=0.2, window_messages=10)
    feed(guard, ("x" + "." * 9) * 50)  # a steady 10% of bad input is tolerated
    with pytest.raises(DlqLimitExceededError, match="3 invalid messages in a row"):
        feed(guard, "xxx")
