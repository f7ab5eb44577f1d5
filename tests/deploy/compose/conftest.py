"""The engine (scripts/docker-local) and the stack, built and brought up once for the
module; phase timings printed at the end of the run (`make compose-test`)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.deploy.compose.stack import Engine, Stack

TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="session")
def engine() -> Iterator[Engine]:
    found = Engine.start()
    TIMINGS["engine, compose and base images (scripts/docker-local start)"] = found.seconds
    try:
        yield found
    finally:
        found.stop()


@pytest.fixture(scope="module")
def stack(engine: Engine) -> Iterator[Stack]:
    """The whole stack, up and healthy (`up --wait`); taken down at the end."""
    made = Stack(engine)
    started = time.monotonic()
    made.compose("build", timeout_s=1200)
    TIMINGS["compose build"] = time.monotonic() - started
    started = time.monotonic()
    try:
        up = made.compose("up", "--detach", "--wait", timeout_s=300, check=False)
        assert up.returncode == 0, (f"up --wait: exit {up.returncode}\n{up.stderr[-2000:]}\n"
                                    f"the daemon's log ends:\n{made.logs('daemon')[-4000:]}")
        TIMINGS["compose up --wait"] = time.monotonic() - started
        yield made
    finally:
        started = time.monotonic()
        made.compose("down", "--volumes", "--timeout", "30", check=False, timeout_s=300)
        made.remove_images()
        TIMINGS["compose down (cleanup)"] = time.monotonic() - started


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for phase, seconds in TIMINGS.items():
        terminalreporter.write_line(f"compose stack: {phase}: {seconds:.0f} s")
