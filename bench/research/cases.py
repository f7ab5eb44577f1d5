"""What the research instruments' command lines share: a parser with ``--smoke``, and
the kernel's payloads at the sizes it chose, built one at a time."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from bench import payloads
from bench.payloads import Payloads
from bench.sizes import FULL, SMOKE


def parser(name: str, description: str | None) -> argparse.ArgumentParser:
    found = argparse.ArgumentParser(prog=f"python -m bench.research {name}",
                                    description=description,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
    found.add_argument("--smoke", action="store_true", help="tiny sizes")
    return found


def kernel_payloads(*, smoke: bool) -> Iterator[tuple[Payloads, int]]:
    """Each kernel case in each encoding, and the messages a poll, as ``make bench``
    measures them (``--smoke``: the smoke run's sizes)."""
    sizes = SMOKE if smoke else FULL
    for case in sizes.kernel_cases:
        for encoding in payloads.ENCODINGS:
            yield payloads.build(case, encoding), sizes.poll_messages
