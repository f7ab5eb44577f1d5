"""The research instruments' tests (bench/research/): marked ``research`` and left out of
every run that does not ask for them, so ``make unit`` and ``make test`` (and any
``-m 'not integration'``) skip them; ``make research`` runs them (``-m research``).

They are slow (one groups 20M rows in a fresh interpreter, others stream in
subprocesses) and test experiments, not the product. A run asks for them by naming the
marker in ``-m`` or a path inside this folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # marked before ``-m`` selects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    research = [item for item in items if HERE in item.path.parents]
    for item in research:
        item.add_marker(pytest.mark.research)
    if _asked_for(config):
        return
    if research:
        config.hook.pytest_deselected(items=research)
        items[:] = [item for item in items if item not in research]


def _asked_for(config: pytest.Config) -> bool:
    """The ``-m`` expression names the marker, or a path on the command line is in here."""
    if "research" in (config.option.markexpr or ""):
        return True
    paths = (Path(arg.split("::")[0]).resolve() for arg in config.args)
    return any(path == HERE or HERE in path.parents for path in paths)
