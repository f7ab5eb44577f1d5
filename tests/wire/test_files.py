from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

from wire.files import InputFile, UnreadableFileError, read_table

Setup = Callable[[Path], Path]

TABLE = pa.table({"site": ["a", "b", None, "d"], "value": [1.5, 2.5, 3.5, None]})


def write_stream(path: Path, *, legacy: bool = False) -> Path:
    options = pa.ipc.IpcWriteOptions(use_legacy_format=legacy)
    with pa.ipc.new_stream(str(path), TABLE.schema, options=options) as writer:
        for batch in TABLE.to_batches(max_chunksize=2):
            writer.write_batch(batch)
    return path


def write_file(path: Path) -> Path:
    with pa.ipc.new_file(str(path), TABLE.schema) as writer:
        writer.write_table(TABLE)
    return path


def write_parquet(path: Path) -> Path:
    pq.write_table(TABLE, path)
    return path


def missing(path: Path) -> Path:
    return path


def directory(path: Path) -> Path:
    path.mkdir()
    return path


def csv(path: Path) -> Path:
    path.write_text("site,value\na,1\n")
    return path


def empty(path: Path) -> Path:
    path.write_bytes(b"")
    return path


def frame_of(table: pa.Table) -> pl.DataFrame:
    result = pl.from_arrow(table)
    assert isinstance(result, pl.DataFrame)
    return result


@pytest.mark.parametrize(("writer", "name", "kind", "rows"), [
    (write_stream, "data.bin", "arrow-stream", None),
    (write_file, "data.bin", "arrow-file", 4),
    (write_parquet, "data.bin", "parquet", 4),
])
def test_the_kind_is_told_by_content_not_name(
    tmp_path: Path, writer: Setup, name: str, kind: str, rows: int | None
) -> None:
    source = InputFile.open(writer(tmp_path / name))
    assert source.kind == kind
    assert source.row_count() == rows
    assert_frame_equal(frame_of(read_table(source.path)), frame_of(TABLE))


def test_batches_come_in_order(tmp_path: Path) -> None:
    batches = list(InputFile.open(write_stream(tmp_path / "x.arrows")).batches())
    assert [batch.num_rows for batch in batches] == [2, 2]
    assert_frame_equal(frame_of(pa.Table.from_batches(batches)), frame_of(TABLE))


def test_a_legacy_stream_is_recognised_by_its_suffix(tmp_path: Path) -> None:
    source = InputFile.open(write_stream(tmp_path / "old.arrows", legacy=True))
    assert source.kind == "arrow-stream"
    assert_frame_equal(frame_of(source.read_table()), frame_of(TABLE))


def test_an_empty_file_keeps_its_schema(tmp_path: Path) -> None:
    path = tmp_path / "empty.arrow"
    with pa.ipc.new_file(str(path), TABLE.schema):
        pass
    assert read_table(path).schema == TABLE.schema


@pytest.mark.parametrize(("make", "message"), [
    (missing, "no such file"),
    (directory, "is a directory"),
    (csv, "not an Arrow IPC stream"),
    (empty, "not an Arrow IPC stream"),
])
def test_files_that_cannot_be_input_say_why_in_one_line(
    tmp_path: Path, make: Setup, message: str
) -> None:
    path = make(tmp_path / "input.csv")
    with pytest.raises(UnreadableFileError, match=message) as caught:
        InputFile.open(path)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("writer", [write_stream, write_file, write_parquet])
def test_a_damaged_file_is_unreadable_not_a_traceback(tmp_path: Path, writer: Setup) -> None:
    path = writer(tmp_path / "data.arrows")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(UnreadableFileError, match="cannot read it") as caught:
        read_table(path)
    assert "\n" not in str(caught.value)
