"""`python -m consumer run` as a service, without a broker: a taken HTTP port and an
unreachable broker are one line and exit 1, and the signal handlers are put back."""

from __future__ import annotations

import logging
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumer.cli import main
from tests.conftest import REPO

SIGNALS = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("ARROWAGG_") or name in {"KAFKA_BOOTSTRAP_SERVERS", "NOTIFY_SOCKET"}:
            monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """main() configures the root logger onto this test's captured stderr: undo that."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def config(tmp_path: Path, port: int, bootstrap: str = "127.0.0.1:1") -> Path:
    text = (REPO / "config.yaml").read_text()
    text = text.replace("http_port: 9464-9474", f"http_port: {port}")
    text = text.replace("bootstrap_servers: 127.0.0.1:9092", f"bootstrap_servers: {bootstrap}")
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_a_taken_http_port_is_one_line_and_exit_1(
        tmp_path: Path, taken_port: int, capsys: pytest.CaptureFixture[str]) -> None:
    before = [signal.getsignal(s) for s in SIGNALS]
    assert main(["run", "--config", str(config(tmp_path, taken_port))]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"consumer: cannot serve HTTP on 127.0.0.1:{taken_port} (")
    assert "Traceback" not in "\n".join(err)
    assert [signal.getsignal(s) for s in SIGNALS] == before


def test_an_unreachable_broker_closes_the_http_server_and_restores_signals(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = [signal.getsignal(s) for s in SIGNALS]
    with socket.socket() as probe:  # a free port, known in advance
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    assert main(["run", "--config", str(config(tmp_path, port))]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("consumer: cannot reach Kafka at 127.0.0.1:1 (nothing listens there: "
                       f"Connection refused); check kafka.bootstrap_servers in {tmp_path}/"
                       "config.yaml")
    assert f"on http://127.0.0.1:{port}" in "\n".join(err)
    assert [signal.getsignal(s) for s in SIGNALS] == before
    with socket.socket() as again:  # closed: the port can be bound again
        again.bind(("127.0.0.1", port))
