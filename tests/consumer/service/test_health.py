"""The HTTP endpoints through real requests to an ephemeral port."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from consumer.healthcheck import main as healthcheck
from consumer.service.health import HealthServer, ServiceSetupError
from tests.consumer.service.probes import http_get


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
