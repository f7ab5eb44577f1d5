"""``python -m bench.research``: one instrument by name, or the list of them."""

from __future__ import annotations

import pytest

from bench.research import __main__ as research


def test_an_unknown_name_gets_the_list_of_instruments(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert research.main(["no_such_instrument"]) == 2
    usage = capsys.readouterr().err
    assert all(f"``{name}``" in usage for name in research.INSTRUMENTS)


def test_an_instrument_runs_by_its_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert research.main(["sessions", "--smoke"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("tumbling 10 s", "session, gap 1 s"))
