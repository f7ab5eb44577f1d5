"""Where arrowagg's kernel time goes beyond the Polars floor's, stage by stage.

``bench.kernel_floor`` says how far arrowagg is from the floor; this says where the rest
goes. arrowagg's kernel run (``bench.kernel.run_arrowagg``: the daemon's pipeline) is
timed whole and with each stage's calls timed as they happen (wall time, the calls
wrapped as ``bench.memory_floor`` wraps them for RSS):

- ``checks``: ``wire.input``'s checks of untrusted bytes (declared sizes, schema text,
  full validation);
- ``decode``: the rest of decoding a message to the plan's columns and event-time range;
- ``poll_frame``: a poll's tables made one frame;
- ``partial`` / ``merge`` / ``finalize``: a poll's rows pre-aggregated, a window's
  partials merged, a closing window's results made;
- ``encode``: the results encoded as output records;
- ``other``: the whole less the above (window bookkeeping, offsets, commit points).

The floor (``bench.floor``'s per-poll shape, arrowagg's own) is timed in the same
stages where it has them: ``read`` (pyarrow, no validation), ``group + merge`` (each
poll grouped, the partials merged), ``encode``. Runs interleave; medians are printed.

    python -m bench.stage_times            # the full kernel cases, both encodings
    python -m bench.stage_times --smoke
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any
from unittest import mock

from bench import floor, kernel, payloads
from bench.payloads import Payloads
from bench.sizes import FULL, SMOKE
from consumer.core import pipeline
from consumer.core.aggregate import PartialAggregator
from consumer.core.decode import Decoder
from consumer.core.emit import ResultEmitter
from wire import input as wire_input

# stage: (the object holding it, the attribute called)
STAGES: dict[str, tuple[Any, str]] = {
    "decode": (Decoder, "decode"), "poll_frame": (pipeline, "poll_frame"),
    "partial": (PartialAggregator, "partial"), "merge": (PartialAggregator, "merge"),
    "finalize": (PartialAggregator, "finalize"), "encode": (ResultEmitter, "window_records"),
    **{f"checks.{name}": (wire_input, name)
       for name in ("validate_batch", "_check_declared_sizes", "_check_schema")},
}


@contextmanager
def timed_stages(spent: dict[str, float]) -> Iterator[None]:
    """While open, every stage's calls add their wall seconds to ``spent[stage]``."""
    with ExitStack() as patches:
        for stage, (owner, name) in STAGES.items():
            original = getattr(owner, name)

            def timed(*args: Any, _stage: str = stage, _call: Any = original,
                      **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return _call(*args, **kwargs)
                finally:
                    spent[_stage] = spent.get(_stage, 0.0) + time.perf_counter() - started

            patches.enter_context(mock.patch.object(owner, name, timed))
        yield


def arrowagg_stages(built: Payloads, poll: int) -> dict[str, float]:
    """One kernel run of arrowagg, its seconds by stage (``decode`` without the checks)."""
    spent: dict[str, float] = {}
    with timed_stages(spent):
        started = time.perf_counter()
        kernel.run_arrowagg(built, poll)
        whole = time.perf_counter() - started
    checks = sum(s for name, s in spent.items() if name.startswith("checks."))
    stages = {"checks": checks, "decode": spent.get("decode", 0.0) - checks,
              **{name: spent.get(name, 0.0) for name in
                 ("poll_frame", "partial", "merge", "finalize", "encode")}}
    return {**stages, "other": whole - sum(stages.values()), "whole": whole}


def floor_stages(built: Payloads, poll: int) -> dict[str, float]:
    """The floor's per-poll shape, its stages one after the other."""
    plan = floor._plan(built)
    seconds: dict[str, float] = {}
    polls: list[Any] = _timed(seconds, "read", lambda: list(floor._read_polls(built, poll)))
    grouped = _timed(seconds, "group + merge", lambda: floor.grouped_polls(polls, plan))
    _timed(seconds, "encode", lambda: floor.encoded_windows(grouped))
    return {**seconds, "whole": sum(seconds.values())}


def _timed(seconds: dict[str, float], stage: str, run: Callable[[], Any]) -> Any:
    started = time.perf_counter()
    result = run()
    seconds[stage] = time.perf_counter() - started
    return result


def measure(built: Payloads, *, repetitions: int, poll: int) -> dict[str, dict[str, float]]:
    """Median seconds by stage of arrowagg and the floor, their runs interleaved."""
    runs: dict[str, list[dict[str, float]]] = {"arrowagg": [], "floor": []}
    for _ in range(repetitions):
        runs["arrowagg"].append(arrowagg_stages(built, poll))
        runs["floor"].append(floor_stages(built, poll))
    return {who: {stage: statistics.median(run[stage] for run in taken)
                  for stage in taken[0]} for who, taken in runs.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stage_times", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes")
    args = parser.parse_args(argv)
    sizes = SMOKE if args.smoke else FULL
    for case in sizes.kernel_cases:
        for encoding in payloads.ENCODINGS:
            medians = measure(payloads.build(case, encoding), repetitions=case.repetitions,
                              poll=sizes.poll_messages)
            for who, stages in medians.items():
                print(f"{case.name}, {encoding}, {who}: " + ", ".join(
                    f"{name} {s:.3f}" for name, s in stages.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
