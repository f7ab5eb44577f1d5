"""A command whose reader goes away (``| head -1``) ends quietly, as ``cat`` does: no
traceback, no "Exception ignored", exit code 141 (128 + SIGPIPE). Real processes, real
pipes: the read end is closed before the command writes, so its first write fails."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from tests.wire.helpers import closed_pipe_run
from wire.errors import EXIT_PIPE_CLOSED


def sample(tmp_path: Path) -> Path:
    path = tmp_path / "sample.arrows"
    table = pa.table({"site": ["a"], "ts": pa.array([0], pa.timestamp("ms", "UTC")),
                      "reading": [1.0]})
    with pa.ipc.new_stream(str(path), table.schema) as writer:
        writer.write_table(table)
    return path


@pytest.mark.parametrize("argv", [
    ["consumer", "check", "--offline", "--config", "config.yaml"],
    ["consumer", "explain", "--config", "config.yaml", "--sample", "SAMPLE"],
    ["producer", "generate", "--batches", "1", "--rows-per-batch", "10", "--out", "OUT"],
])
def test_a_closed_pipe_ends_the_command_quietly(argv: list[str], tmp_path: Path) -> None:
    places = {"SAMPLE": str(sample(tmp_path)), "OUT": str(tmp_path / "out.arrows")}
    done = closed_pipe_run(*(places.get(arg, arg) for arg in argv))
    assert (done.returncode, done.stderr.decode()) == (EXIT_PIPE_CLOSED, "")
