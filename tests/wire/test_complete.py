"""Subscribers get each window once, whole: chunks, revisions and scale-out parts."""

from __future__ import annotations

import polars as pl

from wire.complete import WindowAssembler
from wire.output import OutputWindow, RevisionKind, WindowEnd


def piece(rows: int, *, chunk: tuple[int, int] = (1, 1), part: tuple[int, int] | None = None,
          final: bool = True, revision: int = 0) -> OutputWindow:
    frame = pl.DataFrame({"k": [f"k{i}" for i in range(rows)], "row_count": [1] * rows})
    return OutputWindow(0, 1000, final, revision, rows, chunk, frame, part)


def test_scale_out_parts_complete_the_window_once_all_have_ended() -> None:
    assembler = WindowAssembler()
    assert assembler.add(piece(2, part=(1, 3))) is None
    assert assembler.add(WindowEnd(0, 1000, (1, 3), rows=2, messages=1, input_rows=2)) is None
    assert assembler.add(WindowEnd(0, 1000, (2, 3), rows=0, messages=0, input_rows=0)) is None
    assert assembler.add(piece(3, chunk=(1, 2), part=(3, 3))) is None
    assert assembler.add(WindowEnd(0, 1000, (3, 3), rows=5, messages=2, input_rows=5)) is None
    assert assembler.pending() == [0], "part 3 still misses a chunk"
    whole = assembler.add(piece(2, chunk=(2, 2), part=(3, 3)))
    assert whole is not None
    assert whole.frame.height == 7
    assert whole.window_rows == 7
    assert assembler.pending() == []
    assert assembler.add(piece(2, part=(1, 3))) is None, "a repeat after completion"


def test_one_instance_chunks_complete_the_final_revision() -> None:
    assembler = WindowAssembler()
    assert assembler.add(piece(1, final=False, revision=0)) is None  # an early revision
    assert assembler.add(piece(2, chunk=(2, 2), revision=1)) is None
    whole = assembler.add(piece(3, chunk=(1, 2), revision=1))
    assert whole is not None
    assert whole.frame.height == 6  # the early revision's rows and the final's both
    assert whole.revision == 1


def test_a_repeated_message_is_counted_once() -> None:
    assembler = WindowAssembler()
    assert assembler.add(piece(2, chunk=(1, 2))) is None
    assert assembler.add(piece(2, chunk=(1, 2))) is None  # at-least-once repeat
    whole = assembler.add(piece(1, chunk=(2, 2)))
    assert whole is not None
    assert whole.frame.height == 3


def rows(*pairs: tuple[str | None, int]) -> pl.DataFrame:
    return pl.DataFrame({"window_start": [0] * len(pairs), "k": [k for k, _ in pairs],
                         "v": [v for _, v in pairs]})


def message(frame: pl.DataFrame, *, revision: int, kind: RevisionKind = "update",
            final: bool = True, chunk: tuple[int, int] = (1, 1),
            window_rows: int = 0) -> OutputWindow:
    return OutputWindow(0, 1000, final, revision, window_rows, chunk, frame, kind=kind,
                        keys=("k",) if kind == "update" else None)


def test_an_update_replaces_its_groups_and_hands_the_window_out_again() -> None:
    assembler = WindowAssembler()
    first = assembler.add(message(rows(("a", 1), ("b", 2), (None, 3)), revision=0,
                                  kind="full", window_rows=6))
    assert first is not None
    assert first.frame.sort("k").rows() == [(0, None, 3), (0, "a", 1), (0, "b", 2)]
    assert assembler.add(message(rows(("b", 20)), revision=1, chunk=(1, 2))) is None
    updated = assembler.add(message(rows((None, 30), ("c", 4)), revision=1, chunk=(2, 2),
                                    window_rows=9))
    assert updated is not None
    assert (updated.revision, updated.window_rows, updated.final) == (1, 9, True)
    assert updated.frame.sort("k").rows() == [(0, None, 30), (0, "a", 1), (0, "b", 20),
                                              (0, "c", 4)]
    again = assembler.add(message(rows(("a", 10)), revision=2, window_rows=10))
    assert again is not None
    assert again.frame.sort("k").rows() == [(0, None, 30), (0, "a", 10), (0, "b", 20),
                                            (0, "c", 4)]
    assert assembler.add(message(rows(("a", 10)), revision=2)) is None, "a repeat"


def test_an_update_replaces_rows_of_the_closing_delta_only() -> None:
    assembler = WindowAssembler()
    assert assembler.add(message(rows(("a", 1)), revision=0, kind="delta", final=False,
                                 window_rows=1)) is None
    whole = assembler.add(message(rows(("a", 2)), revision=1, kind="delta", window_rows=1))
    assert whole is not None
    assert whole.kind == "delta"
    updated = assembler.add(message(rows(("a", 5)), revision=2, window_rows=2))
    assert updated is not None
    # Add per group, as for any delta: 1 (the early revision) + 5 (the closing one, updated).
    assert updated.frame.rows() == [(0, "a", 1), (0, "a", 5)]
    assert updated.window_rows == 3


def test_an_update_of_a_window_never_seen_is_handed_out_as_it_is() -> None:
    assembler = WindowAssembler(max_kept_windows=1)
    update = assembler.add(message(rows(("a", 7)), revision=3, window_rows=4))
    assert update is not None
    assert (update.kind, update.revision, update.frame.rows()) == ("update", 3, [(0, "a", 7)])


def part(frame: pl.DataFrame, k: int, *, revision: int = 0,
         kind: RevisionKind = "full") -> OutputWindow:
    return OutputWindow(0, 1000, True, revision, frame.height, (1, 1), frame, (k, 2),
                        kind=kind, keys=("k",) if kind == "update" else None)


def test_an_update_of_a_part_before_another_part_ends_waits_for_the_whole_window() -> None:
    """With the scale-out, stage 2's partitions close a window each on its own floor: part
    2 can be revised (late rows, window.late: revise) before part 1 has ended."""
    assembler = WindowAssembler()
    assert assembler.add(part(rows(("b", 2)), 2)) is None
    assert assembler.add(WindowEnd(0, 1000, (2, 2), rows=1, messages=1, input_rows=1)) is None
    assert assembler.add(part(rows(("b", 20)), 2, revision=1, kind="update")) is None
    assert assembler.add(part(rows(("a", 1)), 1)) is None
    whole = assembler.add(WindowEnd(0, 1000, (1, 2), rows=1, messages=1, input_rows=1))
    assert whole is not None, "the window is whole once part 1 has ended"
    assert whole.frame.sort("k").rows() == [(0, "a", 1), (0, "b", 20)]
    assert assembler.add(part(rows(("b", 20)), 2, revision=1, kind="update")) is None, \
        "a repeat of the update already applied"
