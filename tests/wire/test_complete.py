"""Subscribers get each window once, whole: chunks, revisions and scale-out parts."""

from __future__ import annotations

import polars as pl

from wire.complete import WindowAssembler
from wire.output import OutputWindow, WindowEnd


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
