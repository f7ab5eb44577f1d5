"""What the tests of the wire and of the command lines share: a command run with a
closed stdout, and the form of an RFC 3339 UTC time."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.conftest import REPO

RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def closed_pipe_run(*argv: str) -> subprocess.CompletedProcess[bytes]:
    """Run ``python -m argv...`` with a stdout whose reader has already gone."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ARROWAGG_") and k != "KAFKA_BOOTSTRAP_SERVERS"}
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", *argv], stdout=write_end,
                              stderr=subprocess.PIPE, cwd=REPO, env=env, timeout=120,
                              check=False)
    finally:
        os.close(write_end)
