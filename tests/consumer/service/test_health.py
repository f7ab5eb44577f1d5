"""The HTTP endpoints through real requests to an ephemeral port."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from consumer.healthcheck import main as healthcheck
from consumer.service.health import HealthServer, ServiceSetupError
from consumer.service.port_file import INSTANCE_HEADER, port_file, read_port, write_port
from tests.consumer.service.probes import free_port_range, http_get


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def server(clock: FakeClock) -> Iterator[HealthServer]:
    health = HealthServer("127.0.0.1", 0, metrics=lambda: b"# metrics body\n",
                          liveness_timeout_s=10, clock=clock)
    yield health
    health.close()


def test_the_port_is_ephemeral_and_exposed(server: HealthServer) -> None:
    assert server.port > 0
    assert http_get(server.port, "/metrics")[0] == 200


def test_healthz_follows_the_main_loop(server: HealthServer, clock: FakeClock) -> None:
    assert http_get(server.port, "/healthz")[:1] == (200,)  # start-up counts as a turn
    clock.now += 11
    status, content_type, body = http_get(server.port, "/healthz")
    assert (status, body) == (503, "main loop stalled\n")
    assert content_type.startswith("text/plain")
    server.loop_turned(0)
    assert http_get(server.port, "/healthz")[0] == 200
    clock.now += 9.5
    assert http_get(server.port, "/healthz")[0] == 200


def test_readyz_follows_the_last_state(server: HealthServer) -> None:
    assert http_get(server.port, "/readyz")[0] == 503  # nothing reported yet
    server.state(open_windows=0, groups=0, ready=True)
    assert http_get(server.port, "/readyz")[::2] == (200, "ready\n")
    server.state(open_windows=3, groups=10, ready=False)
    assert http_get(server.port, "/readyz")[0] == 503
    server.state(open_windows=3, groups=10, ready=True)
    server.stopping()
    assert http_get(server.port, "/readyz")[0] == 503


def test_metrics_body_and_content_type(server: HealthServer) -> None:
    status, content_type, body = http_get(server.port, "/metrics?x=1")
    assert (status, body) == (200, "# metrics body\n")
    assert content_type.startswith("text/plain; version=")


def test_unknown_path_is_404(server: HealthServer) -> None:
    assert http_get(server.port, "/")[0] == 404


def test_a_taken_port_is_one_clear_line(server: HealthServer) -> None:
    with pytest.raises(ServiceSetupError) as info:
        HealthServer("127.0.0.1", server.port, metrics=lambda: b"", liveness_timeout_s=1)
    assert f"cannot serve HTTP on 127.0.0.1:{server.port}" in str(info.value)
    assert "service.http_port" in str(info.value)
    assert "\n" not in str(info.value)


def test_the_container_healthcheck_command(server: HealthServer, clock: FakeClock,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert healthcheck(["--port", str(server.port)]) == 0
    assert healthcheck(["--port", str(server.port), "--path", "/readyz"]) == 1
    clock.now += 60
    assert healthcheck(["--port", str(server.port)]) == 1
    assert "HTTP 503" in capsys.readouterr().err


def test_the_healthcheck_says_when_nothing_listens(server: HealthServer,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    port = server.port
    server.close()
    assert healthcheck(["--port", str(port), "--timeout-s", "1"]) == 1
    assert f"127.0.0.1:{port}/healthz" in capsys.readouterr().err


# -- ports: ranges, the port file, the healthcheck that finds it --------------------------


def test_a_range_takes_its_first_free_port_and_writes_it_down(tmp_path: Path) -> None:
    low, high = free_port_range(2)
    first = HealthServer("127.0.0.1", low, metrics=lambda: b"", liveness_timeout_s=10)
    path = tmp_path / "g-b.port"
    try:
        second = HealthServer("127.0.0.1", range(low, high + 1), metrics=lambda: b"",
                              liveness_timeout_s=10, identity="g-b", port_file=path)
        assert second.port == high
        assert read_port(path) == ("127.0.0.1", high)
        with urllib.request.urlopen(f"http://127.0.0.1:{high}/healthz", timeout=5) as answer:
            assert answer.headers[INSTANCE_HEADER] == "g-b"
        with pytest.raises(ServiceSetupError) as info:
            HealthServer("127.0.0.1", range(low, high + 1), metrics=lambda: b"",
                         liveness_timeout_s=10)
        assert str(info.value) == (
            f"cannot serve HTTP on 127.0.0.1: ports {low}-{high} are all taken; set "
            "service.http_port to another port or range (0: any free port), or to null for "
            "no HTTP server")
        second.close()
        assert not path.exists(), "the port file goes with the server"
    finally:
        first.close()


def write_config(path: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "kafka": {"group_id": "g"}, "input": {"topics": ["in"]}, "output": {"topic": "out"},
        "window": {"size_ms": 1000, "timestamp_column": "ts"},
        "service": {"http_port": "20000-20010"}}))
    return path


def test_the_healthcheck_finds_an_instance_by_its_config_and_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    # Only the healthcheck's own lines on stderr, whatever handlers earlier tests left.
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    for name in [n for n in os.environ if n.startswith("ARROWAGG_")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("ARROWAGG_PROCESSING__INSTANCE_ID", "b")
    config = write_config(tmp_path / "config.yaml")
    path = port_file("g-b", os.environ)
    servers = [HealthServer("127.0.0.1", 0, metrics=lambda: b"", liveness_timeout_s=10,
                            identity=identity, port_file=path) for identity in ("g-a", "g-b")]
    try:
        assert healthcheck(["--config", str(config)]) == 0
        assert healthcheck([]) == 0, "the only port file here: a container's daemon"
        write_port(path, "127.0.0.1", servers[0].port)  # b's file, a's port: stale
        assert healthcheck(["--config", str(config)]) == 1
        assert capsys.readouterr().err == (
            f"healthcheck: http://127.0.0.1:{servers[0].port}/healthz is answered by g-a, "
            "not g-b: its port file is stale\n")
        monkeypatch.setenv("ARROWAGG_PROCESSING__INSTANCE_ID", "c")
        assert healthcheck(["--config", str(config)]) == 1
        assert capsys.readouterr().err == (
            f"healthcheck: no port file {port_file('g-c', os.environ)}: is the daemon g-c "
            "running?\n")
    finally:
        for server in servers:
            server.close()


def test_the_plain_healthcheck_loads_neither_polars_nor_librdkafka() -> None:
    """A container runs it every few seconds: importing Polars and librdkafka took it
    from 0.3 s to 3 s a run on the CI machine. Only --config needs them."""
    loaded = subprocess.run(
        [sys.executable, "-c", ("import sys, consumer.healthcheck; "
         "print(sorted({'polars', 'pyarrow', 'confluent_kafka'} & set(sys.modules)))")],
        capture_output=True, text=True, check=True, timeout=60)
    assert loaded.stdout.strip() == "[]"
