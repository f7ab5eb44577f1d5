"""The scale-out section's session runs, without a broker: the session count they wait
for, reckoned from the published data, is the one the daemon's engine emits; and what
counts towards it on the output."""

from __future__ import annotations

import polars as pl

from bench import scale_out
from bench.daemon_path import PipelineDriver, bench_settings
from bench.payloads import START_MS, WINDOW_MS, build
from bench.sizes import KernelCase
from wire.output import FrontierMarker, encode_frontier_marker, encode_window


def engine_sessions(values: list[bytes], gap_ms: int) -> tuple[int, int]:
    """The sessions (and late rows) the daemon's own pipeline makes of ``values``."""
    driver = PipelineDriver(bench_settings({
        **scale_out.SESSION, "gap_ms": gap_ms, "time": "event", "timestamp_column": "ts",
        "idle_timeout_ms": 1_000, "max_future_ms": None}))
    emitted = sum(w.frame.height for w in driver.poll(values, 0))
    emitted += sum(w.frame.height for w in driver.flush(1_001))
    return emitted, driver.pipeline.counters.late_rows


def test_the_sessions_counted_from_the_data_are_the_ones_the_engine_emits() -> None:
    # 100 groups, a row every ~125 ms each: a 200 ms gap cuts many sessions, 1 s few.
    built = build(KernelCase("toy", 8, 2_000, 100, 4), "dictionary")
    for gap_ms in (200, scale_out.SESSION_GAP_MS):
        expected = scale_out.sessions_in(built.values, gap_ms)
        assert expected > 100  # more than one a group: the gap cuts
        assert engine_sessions(built.values, gap_ms) == (expected, 0)
    assert scale_out.sessions_in(built.values, 200) > scale_out.sessions_in(built.values, 1_000)


def session_message(starts_ms: list[int], *, final: bool = True,
                    ) -> tuple[bytes, list[tuple[str, bytes]]]:
    starts = pl.Series(starts_ms).cast(pl.Datetime("ms", "UTC"))
    frame = pl.DataFrame({"window_start": starts, "window_end": starts, "site": "s",
                          "row_count": 1})
    [message] = encode_window(frame, start_ms=min(starts_ms), end_ms=max(starts_ms),
                              input_rows=len(starts_ms), fmt="arrow", compression="none",
                              max_bytes=1 << 20, final=final, sessions=True,
                              kind="full" if final else "update", keys=["site"])
    return message.value, message.headers


def test_a_session_run_counts_the_closed_sessions_of_the_data_only() -> None:
    end = START_MS + 3 * WINDOW_MS
    count = scale_out.sessions_before(end)
    assert count(*session_message([START_MS, end - 1, end + 100 * WINDOW_MS])) == 2
    assert count(*session_message([START_MS], final=False)) == 0  # provisional
    marker = encode_frontier_marker(FrontierMarker(end, (1, 6), 2, 1, 10))
    assert count(marker.value, marker.headers) == 0
    window = scale_out.window_ends(scale_out=True)
    assert window(marker.value, marker.headers) == 0
