"""bench.polars_floor: every shape of Polars doing arrowagg's whole job gives the result
DuckDB's SQL gives over the same rows (and arrowagg's)."""

from __future__ import annotations

import pytest

from bench import kernel, payloads, polars_floor
from bench.sizes import KernelCase


@pytest.mark.parametrize("encoding", payloads.ENCODINGS)
def test_every_shape_gives_duckdbs_result(encoding: payloads.Encoding) -> None:
    built = payloads.build(KernelCase("toy", 6, 400, 30, 3), encoding)
    kernel.check_agreement({
        "arrowagg": kernel.run_arrowagg(built, 2),
        "duckdb": kernel.run_duckdb(built, 2),
        **{name: polars_floor.decoded_rows(run(built, 2)) for name, run in (
            ("polars_with_output", polars_floor.run_polars_with_output),
            ("polars_per_poll", polars_floor.run_polars_per_poll),
            ("polars_read_ahead", polars_floor.run_polars_read_ahead))},
    })
