"""One run's sections merged into the results of an earlier one (``--update``).

A section rerun alone (``--sections peers --update``) replaces that section in
``all.json`` and keeps the others, so ``docs/benchmarks.md`` stays whole; a rerun of
some peers (``--peers flink``) replaces those peers' figures and keeps the others'. The machine and
time of the earlier run go with the sections kept from it, and the document says which
sections came from which run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.machine import describe

# Where each section's figures live in the results; the peers share "e2e" with the readers.
PLACES = {"kernel": ("kernel",), "e2e": ("e2e", "encodings"), "peers": ("e2e", "peers"),
          "memory": ("memory",), "latency": ("latency",), "scale_out": ("scale_out",)}
PEER_KEYS = ("peers", "peer_memory")


def merged(previous_file: Path, results: dict[str, Any], sections: list[str],
           ) -> dict[str, Any]:
    """``results`` with every section it did not run taken from ``previous_file``."""
    if not previous_file.exists():
        return results
    previous: dict[str, Any] = json.loads(previous_file.read_text())
    kept = [s for s in PLACES if s not in sections and _has(previous, s)]
    out = dict(results)
    if "peers" in sections:  # a run of some peers (--peers) keeps the others' figures
        out["e2e"] = {**out.get("e2e", {}), **{
            key: {**previous.get("e2e", {}).get(key, {}), **out.get("e2e", {}).get(key, {})}
            for key in PEER_KEYS}}
    for section in kept:
        if section in ("e2e", "peers"):
            keys = PEER_KEYS if section == "peers" else ("encodings",)
            out["e2e"] = {**out.get("e2e", {}),
                          **{k: previous["e2e"][k] for k in keys if k in previous["e2e"]}}
        else:
            out[section] = previous[section]
    older = [{**run, "sections": [s for s in run["sections"] if s in kept]}
             for run in previous.get("earlier", [])]
    older = [run for run in older if run["sections"]]
    own = [s for s in kept if all(s not in run["sections"] for run in older)]
    if own:
        older.append({"sections": own, "started": previous.get("started", "unknown"),
                      "machine": describe(previous["machine"]).splitlines()[0]
                      if "machine" in previous else "unknown"})
    if older:
        out["earlier"] = older
    return out


def _has(results: dict[str, Any], section: str) -> bool:
    found: Any = results
    for key in PLACES[section]:
        if not isinstance(found, dict) or key not in found:
            return False
        found = found[key]
    return True
