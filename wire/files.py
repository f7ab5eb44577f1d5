"""Read record batches from the files workers keep: Arrow IPC streams, Arrow IPC files, Parquet.

The kind is told by the file's first bytes, with the suffix as a fallback for streams
written before Arrow 0.15 (which have no continuation marker to recognise).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import ipc

from wire.errors import UsageError

FileKind = Literal["arrow-stream", "arrow-file", "parquet"]

_MAGIC: Final[dict[bytes, FileKind]] = {
    b"ARROW1": "arrow-file",
    b"PAR1": "parquet",
    b"\xff\xff\xff\xff": "arrow-stream",
}
_STREAM_SUFFIXES: Final = frozenset({".arrows", ".stream"})
_PARQUET_BATCH_ROWS: Final = 65_536


class UnreadableFileError(UsageError):
    """A file that cannot be read as input; ``str()`` is one line naming the file and the mend."""


@dataclass(frozen=True)
class InputFile:
    """A readable input file whose kind is known."""

    path: Path
    kind: FileKind

    @classmethod
    def open(cls, path: str | Path) -> InputFile:
        """Check that ``path`` is a readable Arrow or Parquet file and tell its kind."""
        path = Path(path)
        try:
            with path.open("rb") as handle:
                head = handle.read(8)
        except FileNotFoundError:
            raise UnreadableFileError(f"{path}: no such file; check the path") from None
        except IsADirectoryError:
            raise UnreadableFileError(f"{path}: is a directory; pass the files in it") from None
        except OSError as exc:
            raise UnreadableFileError(f"{path}: cannot read it ({exc.strerror})") from None
        for magic, kind in _MAGIC.items():
            if head.startswith(magic):
                return cls(path, kind)
        if path.suffix.lower() in _STREAM_SUFFIXES and head:
            return cls(path, "arrow-stream")
        raise UnreadableFileError(
            f"{path}: not an Arrow IPC stream, Arrow IPC (Feather v2) file or Parquet file"
        )

    def row_count(self) -> int | None:
        """Rows in the file if its metadata tells cheaply; ``None`` for streams or bad files."""
        try:
            if self.kind == "parquet":
                return int(pq.ParquetFile(self.path).metadata.num_rows)
            if self.kind == "arrow-file":
                # Arrow files keep row counts in each batch's metadata, not in the footer,
                # but reading a batch of a memory-mapped file touches only that metadata.
                with pa.memory_map(str(self.path)) as source, ipc.open_file(source) as reader:
                    rows: int = sum(
                        reader.get_batch(i).num_rows for i in range(reader.num_record_batches)
                    )
                    return rows
        except (pa.ArrowException, OSError):
            return None
        return None

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The file's record batches in order; a damaged file raises UnreadableFileError."""
        with self._reader() as reader:
            yield from self._guarded(reader)

    def schema(self) -> pa.Schema:
        """The file's schema, without reading its rows."""
        with self._reader() as reader:
            return reader.schema

    def read_table(self) -> pa.Table:
        """The whole file as one Table (with its schema even when it holds no rows)."""
        with self._reader() as reader:
            return pa.Table.from_batches(list(self._guarded(reader)), schema=reader.schema)

    def _guarded(self, reader: pa.RecordBatchReader) -> Iterator[pa.RecordBatch]:
        try:
            yield from reader
        except (pa.ArrowException, OSError) as exc:
            raise self._unreadable(exc) from None

    @contextmanager
    def _reader(self) -> Iterator[pa.RecordBatchReader]:
        with ExitStack() as stack:
            try:
                reader = self._open_reader(stack)
            except (pa.ArrowException, OSError) as exc:
                raise self._unreadable(exc) from None
            yield reader

    def _open_reader(self, stack: ExitStack) -> pa.RecordBatchReader:
        if self.kind == "parquet":
            parquet = stack.enter_context(pq.ParquetFile(self.path))
            batches = parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS)
            return pa.RecordBatchReader.from_batches(parquet.schema_arrow, batches)
        if self.kind == "arrow-file":
            file_reader = stack.enter_context(ipc.open_file(self.path))
            batches = (file_reader.get_batch(i) for i in range(file_reader.num_record_batches))
            return pa.RecordBatchReader.from_batches(file_reader.schema, batches)
        return stack.enter_context(ipc.open_stream(stack.enter_context(pa.OSFile(str(self.path)))))

    def _unreadable(self, exc: Exception) -> UnreadableFileError:
        detail = " ".join(str(exc).split())[:200]
        return UnreadableFileError(f"{self.path}: cannot read it as {self.kind} ({detail})")


def read_table(path: str | Path) -> pa.Table:
    """Read an Arrow IPC stream, Arrow IPC file or Parquet file into one Table."""
    return InputFile.open(path).read_table()
