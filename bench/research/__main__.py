"""``python -m bench.research NAME [--smoke]``: run one research instrument."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

INSTRUMENTS = ("floor", "stage_times", "memory_floor", "purge", "sessions", "scale_out_cost")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in INSTRUMENTS:
        print(f"usage: python -m bench.research {{{','.join(INSTRUMENTS)}}} [--smoke]\n\n"
              f"{sys.modules['bench.research'].__doc__}", file=sys.stderr)
        return 2
    instrument = importlib.import_module(f"bench.research.{args[0]}")
    code: int = instrument.main(args[1:])
    return code


if __name__ == "__main__":
    sys.exit(main())
