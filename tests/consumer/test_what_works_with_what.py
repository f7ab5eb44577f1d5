"""The table of what works with what (README.md and docs/design.md) is the configuration
checks' answer, cell by cell: "works" where ``check`` accepts the combination, otherwise
the footnotes of exactly the reasons it gives. A refusal lifted or added in
consumer/config/checks.py fails this test until both tables say so; on failure it
prints the table to paste.

Each "works" is backed by tests of its own: the scale-out matrix
(tests/integration/test_scale_out_matrix.py) and early results
(tests/integration/test_early_results.py) through Kafka, the engines' properties in
tests/consumer/core."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from consumer.config import ConfigError, settings_from_dict

REPO = Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- what-works-with-what -->", "<!-- /what-works-with-what -->"

WINDOWS: dict[str, dict[str, Any]] = {
    "tumbling": {"kind": "tumbling", "size_ms": 60_000, "timestamp_column": "ts"},
    "hopping": {"kind": "hopping", "size_ms": 60_000, "step_ms": 10_000,
                "timestamp_column": "ts"},
    "session": {"kind": "session", "gap_ms": 30_000, "timestamp_column": "ts"},
    "count": {"kind": "count", "count_batches": 100},
}
REVISE = {"late": "revise", "revision_lateness_ms": 60_000}
HOLISTIC = {"columns": {"power": "median"}}
# column title -> (window keys, aggregation section)
COLUMNS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "aggregates that merge": ({}, {}),
    "merge, `late: revise`": (REVISE, {}),
    "holistic (median...)": ({}, HOLISTIC),
    "holistic, `late: revise`": (REVISE, HOLISTIC),
    "early results": ({"emit_every_ms": 1_000}, {}),
}
MODES = {"one instance": None, "scale_out": {"repartition_topic": "sensors-repartition"}}


def refusals(kind: str, mode: str, column: str) -> list[str]:
    """What ``check`` says against this combination (nothing: it works)."""
    window_keys, aggregation = COLUMNS[column]
    document: dict[str, Any] = {"input": {"topics": ["sensors"]},
                                "output": {"topic": "sensors-agg"},
                                "window": {**WINDOWS[kind], **window_keys},
                                "aggregation": aggregation}
    if MODES[mode] is not None:
        document["scale_out"] = MODES[mode]
    try:
        settings_from_dict(document, source="config")
    except ConfigError as err:
        return [line.removeprefix("config: ") for line in str(err).splitlines()]
    return []


def expected_table() -> str:
    """The table and its footnotes, as the checks answer today."""
    notes: dict[str, str] = {}
    lines = ["| windows | " + " | ".join(COLUMNS) + " |",
             "|---|" + "---|" * len(COLUMNS)]
    for kind in WINDOWS:
        for mode in MODES:
            cells = []
            for column in COLUMNS:
                reasons = [notes.setdefault(r, f"({len(notes) + 1})")
                           for r in refusals(kind, mode, column)]
                cells.append("no " + " ".join(reasons) if reasons else "works")
            lines.append(f"| {kind}, {mode} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"- {number} `{reason.split(': ', 1)[0]}`: {reason.split(': ', 1)[1]}"
              for reason, number in notes.items()]
    return "\n".join(lines)


def table_in(path: Path) -> str:
    text = path.read_text()
    found = re.search(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), text, re.DOTALL)
    assert found is not None, f"{path.name} has no {BEGIN} ... {END} table"
    return re.sub(r"  +\n", "\n", found.group(1).strip())


@pytest.mark.parametrize("document", ["README.md", "docs/design.md"])
def test_the_table_says_what_the_checks_accept(document: str) -> None:
    expected = expected_table()
    assert table_in(REPO / document) == expected, (
        f"{document}'s table of what works with what is out of date; between "
        f"{BEGIN} and {END} it should read:\n{expected}")


def test_the_refusals_left_are_the_known_ones() -> None:
    """Each kind works everywhere on one instance (count windows have no late rows to
    revise); with scale_out, time windows lose nothing."""
    for kind in ("tumbling", "hopping", "session"):
        assert all(refusals(kind, "one instance", c) == [] for c in COLUMNS), kind
    for kind in ("tumbling", "hopping"):
        assert all(refusals(kind, "scale_out", c) == [] for c in COLUMNS), kind
    assert refusals("count", "one instance", "merge, `late: revise`")[0].startswith(
        "window.late: belongs to event-time windows")
    [count_out] = refusals("count", "scale_out", "aggregates that merge")
    assert count_out.startswith("scale_out: needs time windows")
