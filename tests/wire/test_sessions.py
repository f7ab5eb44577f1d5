"""Session output as a subscriber holds it: replacements take out the sessions they
name (deltas named add up under the replacing row's start), deltas add up, repeats count
once, in Arrow and JSON lines alike."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from wire.complete import WindowAssembler
from wire.output import (
    FrontierMarker,
    OutputFormat,
    OutputWindow,
    RevisionKind,
    WindowEnd,
    decode_message,
    decode_output,
    encode_frontier_marker,
    encode_window,
)
from wire.sessions import SessionTable

Decoded = OutputWindow | WindowEnd | FrontierMarker

UTC_MS = pl.Datetime("ms", "UTC")


def at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def sessions(*rows: tuple[str, int, int, int, list[int]]) -> pl.DataFrame:
    """(k, start, end, row_count, replaces) rows, as the daemon writes them."""
    return pl.DataFrame(
        {"window_start": [at(r[1]) for r in rows], "window_end": [at(r[2]) for r in rows],
         "k": [r[0] for r in rows], "row_count": [r[3] for r in rows],
         "revision": [0] * len(rows), "replaces": [[at(s) for s in r[4]] for r in rows]},
        schema={"window_start": UTC_MS, "window_end": UTC_MS, "k": pl.String,
                "row_count": pl.Int64, "revision": pl.Int64, "replaces": pl.List(UTC_MS)})


def decoded(frame: pl.DataFrame, *, revision: int, kind: RevisionKind = "full",
            fmt: OutputFormat = "arrow", max_bytes: int = 1_000_000) -> list[OutputWindow]:
    frame = frame.with_columns(pl.lit(revision, pl.Int64).alias("revision"))
    start = int(frame["window_start"].dt.epoch("ms").min())  # type: ignore[arg-type]
    messages = encode_window(frame, start_ms=start, end_ms=start + 1, input_rows=1, fmt=fmt,
                             compression="zstd", max_bytes=max_bytes, revision=revision,
                             final=kind != "delta" or revision > 1, kind=kind, keys=["k"],
                             sessions=True)
    return [decode_output(m.value, m.headers) for m in messages]


def held(table: SessionTable) -> list[tuple[str, int, int]]:
    frame = table.sessions()
    if frame.height == 0:
        return []
    epoch = frame.with_columns(pl.col("window_start").cast(UTC_MS).dt.epoch("ms")) \
        if frame.schema["window_start"] != pl.String else frame.with_columns(
            pl.col("window_start").str.to_datetime(time_zone="UTC").dt.epoch("ms"))
    return sorted(epoch.select("k", "window_start", "row_count").rows())


@pytest.mark.parametrize("fmt", ["arrow", "json"])
def test_an_update_takes_out_the_sessions_it_replaces(fmt: OutputFormat) -> None:
    table = SessionTable()
    first = sessions(("a", 0, 150, 2, []), ("a", 300, 400, 1, []), ("b", 0, 100, 1, []))
    (whole,) = [table.add(m) for m in decoded(first, revision=0, fmt=fmt)]
    assert whole is not None
    assert whole.replaced is not None
    assert whole.replaced.height == 0
    bridge = sessions(("a", 0, 400, 4, [0, 300]))
    (update,) = [table.add(m) for m in decoded(bridge, revision=1, kind="update", fmt=fmt)]
    assert update is not None
    assert update.replaced is not None
    assert sorted(update.replaced["row_count"].to_list()) == [1, 2]
    assert held(table) == [("a", 0, 4), ("b", 0, 1)]


def test_chunks_are_applied_once_all_are_in_and_a_repeat_is_skipped() -> None:
    table = SessionTable()
    rows: list[tuple[str, int, int, int, list[int]]] = [
        (f"k{i}", i * 1000, i * 1000 + 100, 1, []) for i in range(200)]
    pieces = decoded(sessions(*rows), revision=0, max_bytes=1_500)
    assert len(pieces) > 1
    assert [table.add(m) for m in pieces[:-1]] == [None] * (len(pieces) - 1)
    assert table.add(pieces[-1]) is not None
    for piece in pieces:  # at-least-once: the whole revision again
        table.add(piece)
    assert len(held(table)) == 200


def test_chunks_of_two_parts_messages_with_the_same_start_do_not_mix() -> None:
    """Two parts (scale-out) may each send a message starting at the same time, with the
    same revision and kind, in chunks that arrive interleaved: each is its own."""
    table = SessionTable()
    parts = []
    for k, keys in ((1, "a"), (2, "b")):
        rows: list[tuple[str, int, int, int, list[int]]] = [
            (f"{keys}{i}", i * 1000, i * 1000 + 100, k, []) for i in range(100)]
        pieces = decoded(sessions(*rows), revision=0, max_bytes=1_500)
        parts.append([dataclasses.replace(p, part=(k, 2)) for p in pieces])
    assert min(len(p) for p in parts) > 1
    paired = min(len(p) for p in parts)
    interleaved = [piece for pair in zip(*parts, strict=False) for piece in pair]
    interleaved += parts[0][paired:] + parts[1][paired:]
    wholes = [w for w in (table.add(m) for m in interleaved) if w is not None]
    assert len(wholes) == 2
    for whole in wholes:
        counts = whole.frame.get_column("row_count").to_list()
        assert whole.part is not None
        assert counts == [whole.part[0]] * 100, "a part's own rows, all of them"
    assert len(held(table)) == 200


def test_deltas_of_one_session_are_held_as_rows_to_add() -> None:
    table = SessionTable()
    for revision in (0, 1):
        for message in decoded(sessions(("a", 0, 100 + revision, 2, [])), revision=revision,
                               kind="delta"):
            table.add(message)
    assert held(table) == [("a", 0, 2), ("a", 0, 2)]


def apply(table: SessionTable, frame: pl.DataFrame, *, revision: int,
          kind: RevisionKind = "full", fmt: OutputFormat = "arrow") -> OutputWindow:
    (whole,) = [w for m in decoded(frame, revision=revision, kind=kind, fmt=fmt)
                if (w := table.add(m)) is not None]
    return whole


@pytest.mark.parametrize("fmt", ["arrow", "json"])
def test_a_row_overlapping_a_session_deltas_gave_joins_it_under_the_earliest_start(
    fmt: OutputFormat,
) -> None:
    # After a restart the daemon no longer knows a's session [1, 51), which went out early
    # in a delta; rows of a at 0 go out as a session [0, 50) of their own. The windows
    # overlap, so they are one session: the delta's row moves to start 0 and adds up.
    table = SessionTable()
    apply(table, sessions(("a", 1, 51, 1, []), ("b", 1, 51, 5, [])), revision=0,
          kind="delta", fmt=fmt)
    whole = apply(table, sessions(("a", 0, 50, 3, [])), revision=1, fmt=fmt)
    assert held(table) == [("a", 0, 1), ("a", 0, 3), ("b", 1, 5)]
    # What it put in and took out, for a subscriber keeping its own copy.
    assert sorted(whole.frame.get_column("row_count").to_list()) == [1, 3]
    assert whole.replaced is not None
    assert whole.replaced.get_column("row_count").to_list() == [1]
    # A repeat of the delta (at-least-once output) is still a repeat under its new start.
    apply(table, sessions(("a", 1, 51, 1, []), ("b", 1, 51, 5, [])), revision=0,
          kind="delta", fmt=fmt)
    assert held(table) == [("a", 0, 1), ("a", 0, 3), ("b", 1, 5)]


def test_sessions_join_through_each_other_and_touching_windows_stay_apart() -> None:
    # Deltas gave a [10, 60) and a [95, 145); a [200, 250) went out whole. A row [40, 100)
    # overlaps both deltas' sessions: the three are one, from 10. [145, 195) only touches
    # [95, 145) (windows are half-open) and [200, 250) is apart from everything.
    table = SessionTable()
    apply(table, sessions(("a", 10, 60, 1, []), ("a", 95, 145, 2, [])), revision=0,
          kind="delta")
    apply(table, sessions(("a", 200, 250, 4, [])), revision=0)
    apply(table, sessions(("a", 40, 100, 8, [])), revision=1)
    assert held(table) == [("a", 10, 1), ("a", 10, 2), ("a", 10, 8), ("a", 200, 4)]
    apply(table, sessions(("a", 145, 195, 16, [])), revision=2)
    assert held(table) == [("a", 10, 1), ("a", 10, 2), ("a", 10, 8), ("a", 145, 16),
                           ("a", 200, 4)]


def test_whole_sessions_that_overlap_are_one_session() -> None:
    # b [0, 300) went out whole; an early revision then let every consumed row go, and
    # after a restart a row of b at 1 went out as b [1, 301), whole too: one session.
    # Its own start again is the same session sent whole again: it replaces the held one.
    table = SessionTable()
    apply(table, sessions(("b", 0, 300, 1, [])), revision=0)
    apply(table, sessions(("b", 1, 301, 1, [])), revision=1)
    assert held(table) == [("b", 0, 1), ("b", 0, 1)]
    apply(table, sessions(("a", 0, 50, 1, [])), revision=0)
    apply(table, sessions(("a", 0, 60, 2, [])), revision=1)
    assert held(table) == [("a", 0, 2), ("b", 0, 1), ("b", 0, 1)]


@pytest.mark.parametrize("fmt", ["arrow", "json"])
def test_a_delta_takes_in_the_deltas_it_replaces_and_drops_the_whole_rows(
    fmt: OutputFormat,
) -> None:
    # a [0, 50) went out whole and is kept (late: revise); a [100, 150) and a [200, 250)
    # went out early. A row at 60 bridges all three: the delta holds the kept session's
    # rows and its own, not what the early revisions sent, which add up under its start.
    table = SessionTable()
    for message in decoded(sessions(("a", 0, 50, 2, [])), revision=0, fmt=fmt):
        table.add(message)
    for message in decoded(sessions(("a", 100, 150, 1, []), ("a", 200, 250, 1, [])),
                           revision=0, kind="delta", fmt=fmt):
        table.add(message)
    (bridged,) = [table.add(m) for m in decoded(
        sessions(("a", 0, 250, 3, [0, 100, 200])), revision=1, kind="delta", fmt=fmt)]
    assert bridged is not None
    assert bridged.replaced is not None
    assert sorted(bridged.replaced["row_count"].to_list()) == [1, 1, 2]
    assert held(table) == [("a", 0, 1), ("a", 0, 1), ("a", 0, 3)]
    # Its closing delta names its own start: the deltas held there stay.
    for message in decoded(sessions(("a", 0, 300, 1, [0])), revision=2, kind="delta",
                           fmt=fmt):
        table.add(message)
    assert held(table) == [("a", 0, 1), ("a", 0, 1), ("a", 0, 1), ("a", 0, 3)]


def test_the_assembler_hands_session_output_to_its_table() -> None:
    assembler = WindowAssembler()
    (message,) = decoded(sessions(("a", 0, 150, 2, [])), revision=0)
    whole = assembler.add(message)
    assert whole is not None
    assert whole.sessions
    assert_frame_equal(assembler.sessions.sessions(), message.frame)


def test_a_whole_row_after_deltas_of_its_session_adds_to_them() -> None:
    # A restart can lose a session's early revisions; the rest of it then goes out whole,
    # maybe under the same window_start: the deltas stay.
    table = SessionTable()
    for message in decoded(sessions(("a", 0, 100, 2, [])), revision=0, kind="delta"):
        table.add(message)
    for message in decoded(sessions(("a", 0, 150, 3, [])), revision=0, kind="full"):
        table.add(message)
    assert held(table) == [("a", 0, 2), ("a", 0, 3)]
    for message in decoded(sessions(("a", 0, 150, 4, [])), revision=1, kind="full"):
        table.add(message)
    assert held(table) == [("a", 0, 2), ("a", 0, 4)], "a whole row replaces a whole row"


def provisional(frame: pl.DataFrame, *, revision: int) -> list[OutputWindow]:
    """Open sessions as early results send them: final: false, kind update."""
    return [dataclasses.replace(m, final=False)
            for m in decoded(frame, revision=revision, kind="update")]


def test_a_later_row_supersedes_the_provisional_sessions_starting_within_its_bounds() -> None:
    table = SessionTable()
    for message in provisional(sessions(("a", 100, 250, 2, []), ("a", 300, 400, 1, []),
                                        ("b", 120, 220, 1, [])), revision=0):
        table.add(message)
    for message in provisional(sessions(("a", 40, 400, 5, [])), revision=1):  # merged
        table.add(message)
    assert held(table) == [("a", 40, 5), ("b", 120, 1)]
    for message in decoded(sessions(("a", 40, 450, 6, []), ("b", 120, 220, 1, [])),
                           revision=2):  # closing, full
        table.add(message)
    assert held(table) == [("a", 40, 6), ("b", 120, 1)]


def test_the_assembler_leaves_provisional_sessions_out() -> None:
    assembler = WindowAssembler()
    (early,) = provisional(sessions(("a", 0, 150, 2, [])), revision=0)
    assert assembler.add(early) is None
    (closing,) = decoded(sessions(("a", 0, 250, 3, [])), revision=1)
    assert assembler.add(closing) is not None
    assert held(assembler.sessions) == [("a", 0, 3)]


def test_a_parts_batch_is_handed_out_once_its_marker_and_messages_are_in() -> None:
    """The scale-out: a part's sessions wait for the frontier marker that counts them,
    in whatever order they arrive; through() is the lowest part's frontier."""
    def sessions(start: int, rows: int) -> pl.DataFrame:
        return pl.DataFrame({
            "window_start": [datetime.fromtimestamp(start / 1000, UTC)] * rows,
            "window_end": [datetime.fromtimestamp((start + 100) / 1000, UTC)] * rows,
            "k": [f"k{i}" for i in range(rows)], "row_count": [1] * rows})

    def data(start: int, part: int, through: int) -> list[Decoded]:
        return [decode_message(m.value, m.headers) for m in encode_window(
            sessions(start, 2), start_ms=start, end_ms=start + 100, input_rows=2, fmt="arrow",
            compression="zstd", max_bytes=1_000_000, part=(part, 2), keys=["k"],
            sessions=True, frontier_batch=through)]

    def marker(part: int, through: int, messages: int) -> Decoded:
        m = encode_frontier_marker(FrontierMarker(through, (part, 2), 2 * messages,
                                                  messages, 2 * messages))
        return decode_message(m.value, m.headers)

    assembler = WindowAssembler()
    first, second = data(0, 1, 500), data(200, 1, 500)
    assert assembler.add(marker(1, 500, 2)) is None
    assert assembler.add(first[0]) is None
    assert assembler.session_batches.through() is None
    whole = assembler.add(second[0])
    assert whole is not None
    assert whole.frame.height == 4
    assert assembler.session_batches.through() is None, "part 2 has said nothing yet"
    assert assembler.add(marker(2, 400, 0)) is None
    assert assembler.session_batches.through() == 400
