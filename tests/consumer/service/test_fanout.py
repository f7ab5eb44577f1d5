"""The composite observer: fan-out, failing hooks, the queued reload, start_service."""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from consumer.config import ServiceSettings
from consumer.core.types import ClosedWindow
from consumer.service.fanout import ServiceObserver, start_service
from consumer.service.metrics import Metrics
from consumer.service.observer import NullObserver
from consumer.service.sdnotify import SystemdNotifier
from tests.consumer.service.probes import http_get, scrape, total


class Broken(NullObserver):
    def late(self, rows: int) -> None:
        raise RuntimeError(f"broken with {rows}")


@pytest.fixture
def notify_socket() -> Iterator[socket.socket]:
    with tempfile.TemporaryDirectory(prefix="sd-") as folder, \
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(Path(folder) / "notify"))
        sock.settimeout(2)
        yield sock


@pytest.fixture
def service(notify_socket: socket.socket) -> Iterator[ServiceObserver]:
    observer = start_service(ServiceSettings(http_port=0),
                             {"NOTIFY_SOCKET": notify_socket.getsockname()})
    yield observer
    observer.close()


def test_every_hook_reaches_metrics_health_and_systemd(
        service: ServiceObserver, notify_socket: socket.socket) -> None:
    assert service.health is not None
    port = service.health.port
    assert http_get(port, "/readyz")[0] == 503
    service.assigned([("in", 0)])
    service.consumed(("in", 0), 1, 10, 100)
    service.rejected("not-arrow")
    service.late(2)
    service.committed([ClosedWindow(0, 10, pl.DataFrame(), 10)], 5, 7)
    service.aborted()
    service.rebalanced()
    service.revoked([("in", 0)])
    service.statistics("{}")
    service.loop_turned(0)
    service.state(open_windows=1, groups=3, ready=True)
    assert notify_socket.recv(4096).decode() == (
        "READY=1\nSTATUS=windows emitted 1, lag 0, groups 3")
    assert http_get(port, "/readyz")[0] == 200
    samples = scrape(port)
    for name in ("arrowagg_rows_consumed_total", "arrowagg_rejected_messages_total",
                 "arrowagg_late_rows_total", "arrowagg_windows_emitted_total",
                 "arrowagg_transaction_aborts_total", "arrowagg_rebalances_total",
                 "arrowagg_state_groups"):
        assert total(samples, name) > 0, name
    service.stopping()
    assert notify_socket.recv(4096).decode().startswith("STOPPING=1\n")
    assert http_get(port, "/readyz")[0] == 503
    service.state(open_windows=1, groups=3, ready=True)  # the last turn while stopping
    assert http_get(port, "/readyz")[0] == 503


def test_a_failing_hook_is_logged_once_and_never_raises(
        caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    service = ServiceObserver(metrics, SystemdNotifier(None), others=[Broken()])
    service.late(3)
    service.late(4)
    assert [r.getMessage() for r in caplog.records] == [
        "Broken.late failed (the daemon goes on)"]
    assert b"arrowagg_late_rows_total 7.0" in metrics.exposition()  # the others still ran


def test_reload_runs_on_the_next_turn_not_in_the_signal_handler() -> None:
    service = ServiceObserver(Metrics(), SystemdNotifier(None))
    calls: list[str] = []
    service.on_reload(lambda: calls.append("reload"))
    service.request_reload()  # what the SIGHUP handler does
    assert calls == []
    service.loop_turned(0)
    service.loop_turned(1)
    assert calls == ["reload"]


def test_no_http_server_when_the_port_is_null() -> None:
    service = start_service(ServiceSettings(http_port=None), {})
    assert service.health is None
    assert not service.notifier.enabled
    service.close()
